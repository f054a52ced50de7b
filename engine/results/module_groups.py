"""Repeated blocks folded into one row (`layers.0–79.mlp.up_proj ×80`), and the natural order of module names
(`layers.2` before `layers.10`): how the report and the app list the modules of a large model.

A group sums its members' figures; its members share a type and a path that differs only in the indices of a
container (`nn.ModuleList`, `nn.Sequential`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .types import ModuleRow

_PART = re.compile(r"(\d+)")
_INDEX = "#"  # stands for a container index in a group's key


def natural_key(name: str) -> tuple[tuple[int, int, str], ...]:
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


class ModuleFigures(Protocol):
    """What a module row and a group both carry: the figures that add up across modules."""

    @property
    def parameters(self) -> int: ...
    @property
    def parameter_bytes(self) -> int: ...
    @property
    def gradient_bytes(self) -> int: ...
    @property
    def optimizer_bytes(self) -> int: ...
    @property
    def activation_bytes(self) -> int: ...
    @property
    def bytes_at_peak(self) -> int: ...


def summed_figures(rows: Sequence[ModuleFigures]) -> dict[str, int]:
    """The additive figures of `rows` summed, keyed by field name (ModuleGroup's and the report's field names)."""
    return {
        "parameters": sum(r.parameters for r in rows),
        "parameter_bytes": sum(r.parameter_bytes for r in rows),
        "gradient_bytes": sum(r.gradient_bytes for r in rows),
        "optimizer_bytes": sum(r.optimizer_bytes for r in rows),
        "activation_bytes": sum(r.activation_bytes for r in rows),
        "bytes_at_peak": sum(r.bytes_at_peak for r in rows),
    }


def _group(name: str, rows: Sequence[ModuleRow]) -> ModuleGroup:
    sums = summed_figures(rows)
    return ModuleGroup(name=name, type=rows[0].type, count=len(rows), members=tuple(r.name for r in rows),
                       share_of_peak=sum(r.share_of_peak for r in rows), **sums)


def fold_modules(rows: Iterable[ModuleRow]) -> list[ModuleGroup]:
    """Modules of one type whose dotted paths differ only in numeric parts become one group; the groups come
    largest first (bytes at the peak, then weights), ties in the natural order of their names."""
    buckets: dict[tuple[str, tuple[str, ...]], list[ModuleRow]] = {}
    for r in rows:
        parts = r.name.split(".") if r.name else []
        key = (r.type, tuple(_INDEX if p.isdigit() else p for p in parts))
        buckets.setdefault(key, []).append(r)
    out: list[ModuleGroup] = []
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


@dataclass(frozen=True)
class Block:
    """One block of a model's graph: a top-level module, or a run of alike numbered ones folded into one
    (`layers.0–31 ×32`); `children` are its sub-blocks (of one member, figures summed over the members)."""

    name: str  # 'layers.0–31' for a folded run, the module's path otherwise
    type: str
    count: int
    parameters: int  # all members, children included
    bytes_at_peak: int | None  # all members and their children; None before an estimate
    children: tuple[Block, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.name} ×{self.count}" if self.count > 1 else self.name


def blocks(tree: Sequence[tuple[str, str, int, int]], per_module: Iterable[ModuleRow] | None = None,
           depth: int = 2) -> list[Block]:
    """The model's blocks in order from its module tree ((dotted name, type, own, total parameters), parents
    first): each child of the root, a container's numbered children of one type folded into one block, down to
    `depth` levels. Memory at the peak from an estimate's per-module rows (each module's own, summed below)."""
    kids: dict[str, list[tuple[str, str, int]]] = {}
    totals = {name: total for name, _typ, _own, total in tree}
    for name, typ, _own, total in tree:
        if name:
            kids.setdefault(name.rpartition(".")[0], []).append((name, typ, total))
    mem: dict[str, int] | None = None
    if per_module is not None:
        mem = {}
        for r in per_module:
            mem[r.name if r.name != "(model)" else ""] = r.bytes_at_peak

    # Each module's bytes with everything below it, summed once up its dotted path (the app draws the graph on its
    # GUI thread: matching every row against every prefix took 70 ms on llama-70b's 80 layers).
    below: dict[str, int] = {}
    for k, v in (mem or {}).items():
        while k:
            below[k] = below.get(k, 0) + v
            k = k.rpartition(".")[0]

    def bytes_below(prefixes: Sequence[str]) -> int | None:
        """The bytes of these modules and all below them (siblings, or alike blocks: never one inside another)."""
        if mem is None:
            return None
        return sum(below.get(p, 0) for p in set(prefixes))

    def level(parent_names: Sequence[str], shown_parent: str, d: int) -> list[Block]:
        # The children of the first parent, each matched with the same child of the other (alike) parents.
        first = kids.get(parent_names[0], [])
        out: list[Block] = []
        i = 0
        while i < len(first):
            name, typ, total = first[i]
            leaf = name.rpartition(".")[2]
            shown = f"{shown_parent}.{leaf}" if shown_parent else leaf
            sub = kids.get(name, [])
            numbered = [c for c in sub if c[0].rpartition(".")[2].isdigit()]
            if numbered and len(numbered) == len(sub) and len({c[1] for c in numbered}) == 1 and len(numbered) > 1:
                # A container of alike numbered blocks (ModuleList, Sequential): one folded block.
                idx = [int(c[0].rpartition(".")[2]) for c in numbered]
                flat = [m for p in parent_names for k in idx
                        if (m := f"{p}.{leaf}.{k}" if p else f"{leaf}.{k}") in totals]
                run = f"{shown}.{_indices_text(idx)}"
                children = tuple(level(flat, run, d - 1)) if d > 1 else ()
                out.append(Block(run, numbered[0][1], len(flat), sum(totals[m] for m in flat), bytes_below(flat),
                                 children))
            else:
                # Only the members that have this child (the first block of a stage may have one more).
                same = [m for p in parent_names if (m := f"{p}.{leaf}" if p else leaf) in totals]
                shown = same[0] if len(same) == 1 else shown
                children = tuple(level(same, shown, d - 1)) if d > 1 and sub else ()
                out.append(Block(shown, typ, len(same), sum(totals[m] for m in same), bytes_below(same), children))
            i += 1
        return out

    return level([""], "", depth)
