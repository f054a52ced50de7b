"""Repeated blocks folded into one row (`layers.0–79.mlp.up_proj ×80`), and the natural order of module names
(`layers.2` before `layers.10`): how the report and the app list the modules of a large model.

A group sums its members' figures; its members share a type and a path that differs only in the indices of a
container (`nn.ModuleList`, `nn.Sequential`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .results import ModuleRow

_PART = re.compile(r"(\d+)")
_INDEX = "#"  # stands for a container index in a group's key


def natural_key(name: str) -> tuple:
    """Sort key that orders the numbers inside a name by value: 'layers.2.mlp' < 'layers.10.mlp'."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p.lower()) for p in _PART.split(name) if p)


def _indices_text(values: Sequence[int]) -> str:
    """0,1,…,79 → '0–79'; runs joined with commas: 0–3,8–11."""
    vs = sorted(set(values))
    runs: list[tuple[int, int]] = []
    for v in vs:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return ",".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs)


@dataclass(frozen=True)
class ModuleGroup:
    """One module, or `count` modules alike but for their container indices, with their figures summed."""

    name: str  # 'layers.0–79.mlp' for a group, the module's own name otherwise
    type: str
    count: int
    members: tuple[str, ...]
    parameters: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    bytes_at_peak: int
    share_of_peak: float

    @property
    def label(self) -> str:
        """The name with the count: 'layers.0–79.mlp ×80'."""
        return f"{self.name} ×{self.count}" if self.count > 1 else self.name


_SUMMED = ("parameters", "parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes", "bytes_at_peak")


def _group(name: str, rows: Sequence[ModuleRow]) -> ModuleGroup:
    sums = {k: sum(getattr(r, k) for r in rows) for k in _SUMMED}
    return ModuleGroup(name=name, type=rows[0].type, count=len(rows), members=tuple(r.name for r in rows),
                       share_of_peak=sum(r.share_of_peak for r in rows), **sums)


def fold_modules(rows: Iterable[ModuleRow]) -> list[ModuleGroup]:
    """Modules of one type whose dotted paths differ only in numeric parts become one group; the groups come
    largest first (bytes at the peak, then weights), ties in the natural order of their names."""
    buckets: dict[tuple, list[ModuleRow]] = {}
    for r in rows:
        parts = r.name.split(".") if r.name else []
        key = (r.type, tuple(_INDEX if p.isdigit() else p for p in parts))
        buckets.setdefault(key, []).append(r)
    out = []
    for (_type, pattern), members in buckets.items():
        if len(members) == 1 or _INDEX not in pattern:
            out.extend(_group(m.name, [m]) for m in members)
            continue
        members.sort(key=lambda m: natural_key(m.name))
        split = [m.name.split(".") for m in members]
        name = ".".join(
            _indices_text([int(s[i]) for s in split]) if p == _INDEX else p for i, p in enumerate(pattern)
        )
        out.append(_group(name, members))
    out.sort(key=lambda g: (-g.bytes_at_peak, -g.parameter_bytes, natural_key(g.name)))
    return out
