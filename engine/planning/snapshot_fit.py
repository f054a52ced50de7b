"""A real run's snapshot beside the model it ran: the batch size its inputs imply, the estimate of the same step
with the error of each figure, and — for a run that ran out of memory — what would have fit in the memory it had.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..config.train_config import TrainConfig
from ..core.errors import UserError, printable
from ..core.units import format_bytes
from ..cuda.allocator import parse_alloc_conf
from ..results.types import CATEGORIES, Estimate
from ..trace.meta_build import build_on_meta
from ..trace.recorded_step import flat_tensors
from .estimator import estimate
from .planner import max_batch, recommend

ProgressFn = Callable[[float, str], None]
BLOCK = 512  # the caching allocator rounds every block up to this


def _input_sizes(source: Any, cfg: TrainConfig, batch: int) -> list[int]:
    _model, inputs = build_on_meta(source, cfg.with_(batch_size=batch))
    return [t.numel() * t.element_size() for t in flat_tensors(inputs)]


def infer_batch_size(source: Any, cfg: TrainConfig, input_bytes: int) -> int | None:
    """The batch at which some of the model's inputs (the images without their labels, say) add up exactly to the
    snapshot's input bytes, as requested or in 512-byte blocks (None if no batch does).

    Exactly: a snapshot counts each input's bytes as requested, so a model whose sample is 1.8 % smaller than the
    run's (another image size) matches no batch, where the nearest within 2 % read a batch-512 run as 521."""
    if input_bytes <= 0:
        return None
    try:
        one, two = _input_sizes(source, cfg, 1), _input_sizes(source, cfg, 2)
    except Exception:  # noqa: BLE001 - a model whose inputs do not scale with the batch: no inference
        return None
    if len(one) != len(two):
        return None
    per = [b - a for a, b in zip(one, two, strict=True)]
    fixed = [a - p for a, p in zip(one, per, strict=True)]
    n = min(len(per), 8)
    # all the inputs first, then fewer of them (the run's loop may have put its labels on the GPU later)
    for size in range(n, 0, -1):
        found: set[int] = set()
        for chosen in itertools.combinations(range(n), size):
            step, base = sum(per[i] for i in chosen), sum(fixed[i] for i in chosen)
            if step <= 0:
                continue
            guess = max(1, round((input_bytes - base) / step))
            for b in range(max(1, guess - 1), guess + 2):
                blocks = sum(-(-(fixed[i] + b * per[i]) // BLOCK) * BLOCK for i in chosen)
                if input_bytes in (base + b * step, blocks):
                    found.add(b)
        if found:
            return found.pop() if len(found) == 1 else None
    return None


def config_for(snap: Estimate, source: Any | None, given: dict[str, Any]) -> tuple[TrainConfig, list[str]]:
    """The step's configuration: what the user gave, else what the snapshot shows (and the batch its inputs imply
    for the model), with a note for each figure that was assumed."""
    found = snap.snapshot
    if found is None:
        raise UserError(f"'{snap.model_name}' is not a memory snapshot: nothing to read its step's configuration from")
    implied = found.implied_config
    notes: list[str] = []
    changes = {k: v for k, v in given.items() if v is not None}
    recorded_conf = str(found.alloc_conf or "")
    if "alloc_conf" not in changes and recorded_conf:  # the allocator settings the run had, unless told otherwise
        try:
            parse_alloc_conf(recorded_conf)
        except UserError as e:  # an option this version does not model (a newer PyTorch's, or a forged one)
            notes.append(f"the snapshot's PYTORCH_CUDA_ALLOC_CONF={printable(recorded_conf, 80)} is not one "
                         f"VRAMScope models ({e}): the default allocator assumed; give --alloc-conf")
        else:
            changes["alloc_conf"] = recorded_conf
            notes.append(f"PYTORCH_CUDA_ALLOC_CONF={printable(recorded_conf, 80)} read from the snapshot")
    if "batch_size" not in changes and source is not None:
        b = infer_batch_size(source, implied.with_(**{k: v for k, v in changes.items() if k != "batch_size"}),
                             found.input_bytes)
        if b is not None:
            changes["batch_size"] = b
            notes.append(f"batch size {b} read from the snapshot's input bytes")
        else:
            notes.append("the batch size could not be read from the snapshot's inputs: batch 1 assumed; "
                         "give --batch-size")
    cfg = implied.with_(**changes)
    return cfg, notes


@dataclass(frozen=True)
class Comparison:
    """The estimate of the snapshot's step, and each figure beside the real one."""

    estimate: Estimate
    rows: tuple[tuple[str, int, int, float | None], ...]  # (figure, estimate, snapshot, error %)
    # each row's figure: max_memory_allocated, max_memory_reserved, peak, or a category (what a view labels)
    keys: tuple[str, ...] = ()

    def to_json(self) -> list[dict[str, Any]]:
        return [dict(zip(("figure", "estimate", "measured", "error_pct"), r, strict=True)) for r in self.rows]


def _err(est: int, meas: int) -> float | None:
    return None if not meas else 100.0 * (est - meas) / meas


def compare(snap: Estimate, est: Estimate) -> Comparison:
    """Figure by figure, as `profile --compare` does: the allocator's peaks, then each category at the peak.

    A snapshot cannot tell buffers from parameters, so the estimate's buffers count with its parameters. A run that
    ran out of memory never reached its peak: only what was complete when it failed (parameters, inputs) compares.
    """
    meas = snap.measured
    oom = snap.oom is not None
    rows: list[tuple[str, int, int, float | None]] = []
    keys: list[str] = []

    def add(name: str, e: int, m: int, key: str = "") -> None:
        rows.append((name, e, m, _err(e, m)))
        keys.append(key or name)

    if not oom:
        if est.gpu is not None:
            add("max_memory_allocated", est.replay.max_memory_allocated if est.replay is not None else est.peak_bytes,
                meas.max_memory_allocated if meas is not None else snap.peak_bytes)
            if snap.gpu is not None:
                add("max_memory_reserved", est.gpu.reserved_bytes, snap.gpu.reserved_bytes)
        add("peak (live tensors)", est.peak_bytes, snap.peak_bytes, "peak")
    eb = dict(est.breakdown_at_peak)
    eb["parameters"] = eb.get("parameters", 0) + eb.pop("buffers", 0)
    eb["workspace"] = est.gpu.workspace_bytes if est.gpu is not None else 0
    sb = snap.breakdown_at_peak
    for cat in CATEGORIES + ("workspace",):
        if oom and cat not in ("parameters", "inputs"):
            continue
        e, m = eb.get(cat, 0), sb.get(cat, 0)
        if e or m:
            add(f"  {cat} at the peak" if not oom else f"  {cat}", e, m, cat)
    return Comparison(est, tuple(rows), tuple(keys))


MISMATCH_RATIO = 1.5  # parameter bytes further apart than this: another model (a snapshot cannot tell buffers)


def parameter_mismatch(snap: Estimate, est: Estimate) -> str:
    """'' when the model's parameter (and buffer) bytes are close to those the run held, else one line saying how
    far apart they are: the model open is not the one that ran."""
    run = snap.breakdown_at_peak.get("parameters", 0) + snap.breakdown_at_peak.get("buffers", 0)
    model = est.breakdown_at_peak.get("parameters", 0) + est.breakdown_at_peak.get("buffers", 0)
    if not run or not model or max(run, model) <= MISMATCH_RATIO * min(run, model):
        return ""
    return (f"{est.model_name} holds {format_bytes(model)} of parameters in {est.config.precision}, the run held "
            f"{format_bytes(run)} ({max(run, model) / min(run, model):.1f}× {'more' if model > run else 'less'}): "
            f"it is not the model that ran")


@dataclass(frozen=True)
class Beside:
    """A snapshot beside the model that ran, as `open --model` shows it: the step's configuration as the snapshot
    shows it (not whatever else was set), the estimate of that step figure by figure, and '' or why the model
    does not look like the one that ran."""

    snapshot: Estimate  # named after the model, its modules in the model's class names, the configuration's notes
    config: TrainConfig
    comparison: Comparison
    notes: tuple[str, ...]
    mismatch: str


def beside(snap: Estimate, source: Any, given: dict[str, Any] | None = None, *, cancel: Any = None) -> Beside:
    """The snapshot beside the estimate of its step for `source` (`given`: options the user set, None for those
    read from the snapshot)."""
    given = dict(given or {})
    # The parameter bytes first, at batch 1 (they do not depend on the batch): a model that did not run would have
    # its batch "read" from another model's inputs (a CNN's images as a 70B model's tokens: batch 75,000).
    probe = estimate(source, config_for(snap, None, {**given, "batch_size": given.get("batch_size") or 1})[0],
                     cancel=cancel)
    mismatch = parameter_mismatch(snap, probe)
    if mismatch:
        cfg, notes, est = probe.config, ["batch 1: the model is not the one that ran, so no batch was read from "
                                         "the snapshot's inputs"], probe
    else:
        cfg, notes = config_for(snap, source, given)
        est = probe if cfg == probe.config else estimate(source, cfg, cancel=cancel)
    named = name_modules(with_model(snap, est), source, cfg)
    keep = [n for n in named.notes if not n.startswith("the batch size is not in a snapshot")]
    named = replace(named, notes=tuple(notes) + tuple(keep))
    return Beside(named, cfg, compare(snap, est), tuple(notes), mismatch)


_CHANGE_KEYS = ("title", "detail", "saves_bytes", "new_reserved_bytes", "fits", "cost")


@dataclass(frozen=True)
class FitAnswer:
    """What would have fit in the memory the failed job had (the allocator's reserve when it failed)."""

    budget_bytes: int
    estimate_reserved: int  # the failed configuration, estimated
    max_batch: int | None
    changes: tuple[tuple[str, str, int, int, bool, str], ...]  # title, detail, saves, new reserved, fits, cost

    def to_json(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "estimate_reserved": self.estimate_reserved,
                "max_batch": self.max_batch,
                "changes": [dict(zip(_CHANGE_KEYS, c, strict=True))
                            for c in self.changes]}


def what_fits(snap: Estimate, source: Any, cfg: TrainConfig, base: Estimate, *, cancel: Any = None,
              progress: ProgressFn | None = None) -> FitAnswer:
    """The planner over the snapshot's budget: the reserve the allocator held when the step failed (the job had at
    least that much; the failed request did not fit on top of it). Each change is re-estimated on the same device
    model; `fits` compares its predicted reserved memory with that budget."""
    if snap.oom is None:
        raise UserError("this snapshot was not taken at an out-of-memory error: nothing failed to fit")
    budget = snap.oom.reserved_bytes
    reserved: dict[TrainConfig, int] = {}

    def run(c: TrainConfig) -> Estimate:
        e = estimate(source, c, cancel=cancel)
        reserved[c] = e.gpu.reserved_bytes if e.gpu is not None else e.peak_bytes
        return e

    overhead = (base.gpu.reserved_bytes - base.peak_bytes) if base.gpu is not None else 0
    recs = recommend(source, cfg, base=base, estimator=run, cancel=cancel,
                     progress=(lambda f, m: progress(0.2 + 0.6 * f, m)) if progress else None)
    changes: list[tuple[tuple[str, str, int, int, bool, str], bool]] = []  # (change, changes what is trained)
    for r in recs:
        new_res = reserved.get(r.config, r.new_peak_bytes + overhead) if r.config is not None \
            else r.new_peak_bytes + overhead
        changes.append(((r.title, r.detail, r.saves_bytes, new_res, new_res <= budget, r.cost), r.changes_training))
    best: int | None
    try:
        if progress:
            progress(0.85, "largest batch that fits")
        best = max_batch(source, cfg, budget, figure="reserved", cancel=cancel,
                         estimator=lambda c: estimate(source, c, cancel=cancel)).batch_size
    except UserError:
        best = None  # even batch 1 does not fit
    if best is not None and best < cfg.batch_size and cfg.training:
        # the same effective batch in micro-batches that fit: the smallest accumulation whose micro-batch fits
        k = next((k for k in range(2, cfg.batch_size + 1) if cfg.batch_size % k == 0 and cfg.batch_size // k <= best),
                 None)
        if k is not None:
            micro = cfg.batch_size // k
            acc = cfg.with_(batch_size=micro, grad_accum=cfg.grad_accum * k)
            e = run(acc)
            # this accumulation, the one that fits the budget, instead of the planner's (once, not twice)
            accumulations = {r.title for r in recs if r.config is not None and r.config.grad_accum != cfg.grad_accum}
            changes = [c for c in changes if c[0][0] not in accumulations]
            changes.append(((f"Gradient accumulation ({k} micro-batches of {micro})",
                             f"batch {micro} with --grad-accum {acc.grad_accum}: the same effective batch of "
                             f"{cfg.batch_size * cfg.grad_accum}", base.peak_bytes - e.peak_bytes, reserved[acc],
                             reserved[acc] <= budget, f"{k}× more forward/backward passes per optimizer step"), False))
    # what fits first; among those, the changes that keep the training the same before those that change it
    changes.sort(key=lambda c: (not c[0][4], c[1], -c[0][2]))
    base_res = base.gpu.reserved_bytes if base.gpu is not None else base.peak_bytes
    return FitAnswer(budget, base_res, best, tuple(c for c, _ in changes))


def render_fit(ans: FitAnswer, cfg: TrainConfig) -> str:
    lines = [f"What would have fit in the {format_bytes(ans.budget_bytes)} the allocator held when it failed "
             f"(this configuration is estimated to reserve {format_bytes(ans.estimate_reserved)}):"]
    if ans.max_batch is not None:
        lines.append(f"  largest batch that fits: {ans.max_batch} (was {cfg.batch_size})")
    else:
        lines.append("  even batch size 1 does not fit this budget")
    for title, _detail, saves, new_res, fits, _cost in ans.changes:
        lines.append(f"  {'fits ' if fits else 'short'}  {title[:50]:<50} saves {format_bytes(saves):>11}, "
                     f"reserves {format_bytes(new_res)}")
    return "\n".join(lines)


def _forward_ranges(source: Any, cfg: TrainConfig) -> dict[str, list[tuple[int, int, str]]]:
    """file name → (first line, last line, class) of the forward of every module class the model uses."""
    import inspect

    model, _inputs = build_on_meta(source, cfg.with_(batch_size=1))
    out: dict[str, list[tuple[int, int, str]]] = {}
    seen: set[type] = set()
    for m in model.modules():
        cls = type(m)
        if cls in seen:
            continue
        seen.add(cls)
        try:
            lines, start = inspect.getsourcelines(cls.forward)
            path = inspect.getsourcefile(cls.forward)
        except (OSError, TypeError):
            continue
        if path:
            out.setdefault(path.replace("\\", "/").rsplit("/", 1)[-1], []).append(
                (start, start + len(lines) - 1, cls.__name__))
    return out


def name_modules(snap: Estimate, source: Any, cfg: TrainConfig) -> Estimate:
    """The snapshot's modules, named by call site (`resnet.py:86 › resnet.py:49 › batchnorm.py`), in the model's
    class names where its source says which class each frame is in (`ResNet:86 › Bottleneck:49 › BatchNorm2d`);
    a frame no class of the model explains keeps its file name."""
    try:
        ranges = _forward_ranges(source, cfg)
    except Exception:  # noqa: BLE001 - names are a convenience: the call sites stay when the model will not build
        return snap

    def part(p: str) -> str:
        file, _, line = p.partition(":")
        cands = ranges.get(file, [])
        if line.isdigit():
            names = {n for a, b, n in cands if a <= int(line) <= b}
            return f"{names.pop()}:{line}" if len(names) == 1 else p
        names = {n for _a, _b, n in cands}
        return names.pop() if len(names) == 1 else p

    memo: dict[str, str] = {}

    def rename(label: str) -> str:
        if label not in memo:
            memo[label] = " › ".join(part(p) for p in label.split(" › ")) if label else label
        return memo[label]

    rows = tuple(replace(r, name=rename(r.name), type=rename(r.type) if r.type.endswith(".py") else r.type)
                 for r in snap.per_module)
    timeline = tuple(replace(p, module=rename(p.module)) for p in snap.timeline)
    oom = snap.oom
    if oom is not None:
        new = rename(oom.module)
        oom = replace(oom, module=new, message=oom.message.replace(oom.module, new, 1))
    return replace(snap, per_module=rows, timeline=timeline, peak_module=rename(snap.peak_module), oom=oom)


def with_model(snap: Estimate, est: Estimate) -> Estimate:
    """The snapshot named after the model it ran, with the model's parameter counts."""
    return replace(snap, model_name=f"{est.model_name} (snapshot {snap.model_name})", parameters=est.parameters,
                   trainable_parameters=est.trainable_parameters, config=est.config)
