"""Two estimates (or a real run's snapshot and an estimate) side by side: the headline figures, each category at the
peak, the modules that changed most and the configuration differences; which figure grew past a limit (the memory
guard `vramscope diff --fail-over` and `vramscope.testing` run in CI). Also reads the files they come from."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.errors import UserError
from ..core.units import format_bytes
from ..results.estimate_fields import UserStep
from ..results.types import ALL_CATEGORIES, Estimate
from ..snapshots.reader import open_snapshot

REPORT_FORMAT = "vramscope-report/1"  # report/exports.py's JSON: the estimate is under "estimate"
TOP_MODULES = 8
_PICKLE_MAGIC = (b"\x1f\x8b", b"\x80")  # gzip, or a pickle's PROTO opcode


@dataclass(frozen=True)
class Row:
    """One figure in A and in B (None where that side has none, e.g. a CPU target's reserved bytes)."""

    name: str
    a: int | None
    b: int | None

    @property
    def change(self) -> int | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def percent(self) -> float | None:
        """B's change relative to A, in per cent (None without both figures or from zero)."""
        return None if self.change is None or not self.a else 100.0 * self.change / self.a


@dataclass(frozen=True)
class EstimateDiff:
    a_name: str
    b_name: str
    headline: tuple[Row, ...]  # peak, then reserved and nvidia-smi where either side has them
    categories: tuple[Row, ...]  # at each one's peak, every category either side has
    modules: tuple[Row, ...]  # bytes at the peak: the most changed first
    config: tuple[tuple[str, str, str], ...]  # (setting, A's value, B's value) where they differ

    def row(self, name: str) -> Row | None:
        return next((r for r in self.headline if r.name == name), None)

    def grew(self, percent: float) -> list[str]:
        """What grew more than `percent` from A to B (the peak, the reserved figure): one phrase each."""
        out = []
        for name in ("peak", "reserved"):
            r = self.row(name)
            if r is None or r.change is None or r.a is None or r.b is None:
                continue
            if r.b > r.a * (1 + percent / 100):
                pct = f"+{r.percent:.1f} %" if r.percent is not None else "from zero"
                out.append(f"{name} grew {pct} ({format_bytes(r.a)} -> {format_bytes(r.b)}), more than the "
                           f"{percent:g} % allowed")
        return out

    def to_json(self) -> dict[str, Any]:
        def rows(rs: tuple[Row, ...]) -> list[dict[str, Any]]:
            return [{**asdict(r), "change": r.change, "percent": r.percent} for r in rs]

        return {"a": self.a_name, "b": self.b_name, "headline": rows(self.headline),
                "categories": rows(self.categories), "modules": rows(self.modules),
                "config": [{"setting": s, "a": va, "b": vb} for s, va, vb in self.config]}

    def __str__(self) -> str:
        return self.text()

    def text(self) -> str:
        w = max([12, *(len(r.name) + 2 for r in self.categories + self.modules)])
        head = f"{'':<{w}}{'A':>14}{'B':>14}{'change':>26}"
        lines = [f"A  {self.a_name}", f"B  {self.b_name}", "", head]
        lines += [_line(r, w) for r in self.headline]
        lines += ["", "At the peak, by category"] + [_line(r, w) for r in self.categories]
        if self.modules:
            lines += ["", "Modules that changed most (bytes at the peak)"] + [_line(r, w) for r in self.modules]
        if self.config:
            lines += ["", "Configuration: " + "; ".join(f"{s} {va} -> {vb}" for s, va, vb in self.config)]
        else:
            lines += ["", "Configuration: the same"]
        return "\n".join(lines)


def _cell(v: int | None) -> str:
    return "n/a" if v is None else format_bytes(v)


def _line(r: Row, w: int) -> str:
    if r.change is None:
        change = ""
    elif r.change == 0:
        change = "same"
    else:
        sign = "+" if r.change > 0 else "-"
        pct = f" ({r.percent:+.1f} %)" if r.percent is not None else " (new)"
        change = f"{sign}{format_bytes(abs(r.change))}{pct}"
    return f"  {r.name:<{w - 2}}{_cell(r.a):>14}{_cell(r.b):>14}{change:>26}"


def _headline(a: Estimate, b: Estimate) -> tuple[Row, ...]:
    rows = [Row("peak", a.peak_bytes, b.peak_bytes)]
    ga, gb = a.gpu, b.gpu
    if ga is not None or gb is not None:
        rows.append(Row("reserved", ga.reserved_bytes if ga else None, gb.reserved_bytes if gb else None))
        smi_a = ga.nvidia_smi_bytes if ga and ga.nvidia_smi_bytes else None  # a snapshot has no nvidia-smi figure
        smi_b = gb.nvidia_smi_bytes if gb and gb.nvidia_smi_bytes else None
        if smi_a is not None or smi_b is not None:
            rows.append(Row("nvidia-smi", smi_a, smi_b))
    return tuple(rows)


def _categories(a: Estimate, b: Estimate) -> tuple[Row, ...]:
    ba, bb = a.breakdown_at_peak, b.breakdown_at_peak
    names = [c.value for c in ALL_CATEGORIES if ba.get(c) or bb.get(c)]
    names += sorted(k for k in {*ba, *bb} if k not in names and (ba.get(k) or bb.get(k)))
    return tuple(Row(n, ba.get(n, 0), bb.get(n, 0)) for n in names)


def _modules(a: Estimate, b: Estimate, top: int) -> tuple[Row, ...]:
    ma = {m.name: m.bytes_at_peak for m in a.per_module}
    mb = {m.name: m.bytes_at_peak for m in b.per_module}
    rows = [Row(n, ma.get(n, 0), mb.get(n, 0)) for n in {*ma, *mb} if ma.get(n, 0) != mb.get(n, 0)]
    rows.sort(key=lambda r: (-abs(r.change or 0), r.name))
    return tuple(rows[:top])


def _config(a: Estimate, b: Estimate) -> tuple[tuple[str, str, str], ...]:
    out = []
    if a.model_name != b.model_name:
        out.append(("model", a.model_name, b.model_name))
    ca, cb = a.config.to_json(), b.config.to_json()
    out += [(k, str(ca[k]), str(cb.get(k))) for k in ca if ca[k] != cb.get(k)]
    if a.source != b.source:
        out.append(("source", a.source, b.source))
    sa, sb = a.step, b.step  # a user's own step (vramscope.estimate_step)
    if sa is not None or sb is not None:
        for k, part in _STEP_PARTS:
            va, vb = part(sa) if sa is not None else None, part(sb) if sb is not None else None
            if va != vb:
                out.append((f"step {k}", _listed(va), _listed(vb)))
    return tuple(out)


# The parts of a user's step a diff lists, by name.
_STEP_PARTS: tuple[tuple[str, Callable[[UserStep], object]], ...] = (
    ("function", lambda s: s.function), ("models", lambda s: s.models), ("optimizers", lambda s: s.optimizers),
    ("schedulers", lambda s: s.schedulers), ("autocast", lambda s: s.autocast))


def _listed(v: object) -> str:
    return ", ".join(map(str, v)) or "none" if isinstance(v, tuple) else str(v)


def diff_estimates(a: Estimate, b: Estimate, *, a_name: str = "A", b_name: str = "B",
                   top: int = TOP_MODULES) -> EstimateDiff:
    return EstimateDiff(a_name=a_name, b_name=b_name, headline=_headline(a, b), categories=_categories(a, b),
                        modules=_modules(a, b, top), config=_config(a, b))


def load_estimate(path: str | os.PathLike[str]) -> Estimate:
    """An estimate file (`vramscope estimate -o/--json`, a report's .json) or a PyTorch memory snapshot pickle, as
    an Estimate; UserError with one line naming the file for anything else."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"'{p}' not found" if not p.exists() else f"'{p}' is not a file")
    try:
        with p.open("rb") as f:
            head = f.read(2)
    except OSError as e:
        raise UserError(f"cannot read '{p}': {e.strerror or e}") from None
    if head.startswith(_PICKLE_MAGIC) or p.name.endswith((".pickle", ".pickle.gz", ".pkl")):
        return open_snapshot(p)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"'{p}' is neither JSON nor a snapshot pickle") from None
    except json.JSONDecodeError as e:
        raise UserError(f"'{p}' is not valid JSON (line {e.lineno}: {e.msg}); give a file written by "
                        "`vramscope estimate -o`") from None
    if isinstance(data, dict) and data.get("format") == REPORT_FORMAT and isinstance(data.get("estimate"), dict):
        data = data["estimate"]
    if not isinstance(data, dict) or "peak_bytes" not in data:
        raise UserError(f"'{p}' is not a VRAMScope estimate (it has no peak_bytes); give a file written by "
                        "`vramscope estimate -o` or a memory snapshot")
    try:
        return Estimate.from_json(data)
    except UserError as e:
        raise UserError(f"'{p}': {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        what = f"missing '{e.args[0]}'" if isinstance(e, KeyError) and e.args else f"{type(e).__name__}: {e}"
        raise UserError(f"'{p}' is not a complete VRAMScope estimate ({what}); write it again with "
                        "`vramscope estimate -o`") from None
