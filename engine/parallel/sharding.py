"""Per-rank memory of data / tensor parallel training: which model states each strategy shards, DDP's gradient
buckets, the parameters ZeRO-3 / FSDP gather one unit at a time, and activations split by tensor parallelism.

It rescales a single-GPU Estimate's timeline category by category (the Estimate is traced at the per-GPU batch).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from ..config.train_config import Strategy, TrainConfig
from ..core.errors import UserError
from ..cuda.device_model import fit_verdict
from ..results.estimate_fields import ShardingFigures
from ..results.types import Estimate, MemEvent, TimelinePoint, Trace

GPUS_PER_NODE = 8  # fsdp-hybrid shards within a node and replicates across nodes
DDP_BUCKET_CAP = 25 * 1024**2  # DDP's bucket_cap_mb default
PREFETCH_UNITS = 2  # FSDP/ZeRO-3 hold the unit being computed and the one prefetched

STATES = ("parameters", "gradients", "optimizer_state")


@dataclass(frozen=True)
class ShardPlan:
    strategy: Strategy
    world_size: int
    tp: int
    dp: int  # data-parallel degree = world_size / tp
    shard_degree: int  # ranks the sharded states are split over
    sharded: dict[str, bool]  # {"parameters": bool, "gradients": bool, "optimizer_state": bool}
    factors: dict[str, float]  # category -> per-rank fraction of the single-GPU bytes


@dataclass(frozen=True)
class ShardResult:
    plan: ShardPlan
    peak_bytes: int  # per rank
    peak_index: int
    peak_phase: str
    breakdown_at_peak: dict[str, int]  # category -> bytes, adds up to peak_bytes (extras folded into their category)
    model_state_bytes: int  # persistent parameters + gradients + optimizer state per rank
    extras_at_peak: dict[str, int]  # ddp_buckets, gathered_parameters, unsharded_gradients
    unit_parameter_bytes: int  # the largest wrap unit's parameters (ZeRO-3/FSDP all-gather size)
    notes: tuple[str, ...]
    amounts: dict[str, int] = field(default_factory=dict)  # the strategy's extra buffers (bytes), by kind

    def figures(self, single_gpu_peak_bytes: int) -> ShardingFigures:
        """What an Estimate keeps of the result (Estimate.sharding)."""
        p = self.plan
        return ShardingFigures(
            strategy=p.strategy, world_size=p.world_size, tp=p.tp, dp=p.dp, shard_degree=p.shard_degree,
            sharded=dict(p.sharded), peak_bytes=self.peak_bytes, peak_phase=self.peak_phase,
            breakdown_at_peak=dict(self.breakdown_at_peak), model_state_bytes=self.model_state_bytes,
            extras_at_peak=dict(self.extras_at_peak), unit_parameter_bytes=self.unit_parameter_bytes,
            notes=tuple(self.notes), single_gpu_peak_bytes=single_gpu_peak_bytes)


def zero_model_state_bytes(psi: int, stage: int, n: int, k: int = 12) -> int:
    """Model-state bytes per GPU in the ZeRO paper (Rajbhandari et al. 2020), mixed-precision Adam (K = 12):
    stage 0 (DDP) 2Ψ+2Ψ+KΨ, stage 1 2Ψ+2Ψ+KΨ/N, stage 2 2Ψ+(2+K)Ψ/N, stage 3 (2+2+K)Ψ/N."""
    if stage == 0:
        return (4 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi // n
    if stage == 2:
        return 2 * psi + (2 + k) * psi // n
    if stage == 3:
        return (4 + k) * psi // n
    raise ValueError(f"ZeRO stage {stage}")


def plan_for(cfg: TrainConfig) -> ShardPlan:
    n, tp = cfg.world_size, cfg.tp
    if n % tp:
        raise UserError(f"world size {n} is not a multiple of the tensor-parallel degree {tp}")
    dp = n // tp
    s = cfg.strategy
    shard_degree = min(dp, GPUS_PER_NODE) if s == "fsdp-hybrid" else dp
    sharded = {
        "parameters": s in ("zero3", "fsdp", "fsdp-hybrid"),
        "gradients": s in ("zero2", "zero3", "fsdp", "fsdp-hybrid"),
        "optimizer_state": s in ("zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid"),
    }
    factors = {}
    for cat in STATES:
        factors[cat] = 1.0 / tp / (shard_degree if sharded[cat] else 1)
    # Megatron-style tensor parallelism splits the layers' weights and, with sequence parallelism, their
    # activations; buffers and the inputs stay whole.
    factors["activations"] = 1.0 / tp
    factors["temporaries"] = 1.0 / tp
    factors["buffers"] = 1.0
    factors["inputs"] = 1.0
    return ShardPlan(s, n, tp, dp, shard_degree, sharded, factors)


def _unit_bytes(est: Estimate, param_bytes: int) -> int:
    """The largest repeated block's parameter bytes: FSDP/ZeRO-3 wrap units (one transformer block, one stage)."""
    rows = [r for r in est.per_module if r.parameter_bytes or r.parameters]
    if not rows:
        return param_bytes
    own = {("" if r.name == "(model)" else r.name): r.parameter_bytes for r in rows}
    types = {("" if r.name == "(model)" else r.name): r.type for r in est.per_module}
    subtree: dict[str, int] = defaultdict(int)
    for name, b in own.items():
        parts = name.split(".") if name else []
        for i in range(len(parts) + 1):
            subtree[".".join(parts[:i])] += b
    # repeated blocks: siblings of one type, at least two of them, holding parameters
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name in subtree:
        if not name:
            continue
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        groups[(parent, types.get(name, "?"))].append(name)
    best = 0
    for (_parent, _typ), names in groups.items():
        if len(names) >= 2:
            best = max(best, max(subtree[n] for n in names))
    return min(best or param_bytes, param_bytes)


def shard(est: Estimate, cfg: TrainConfig | None = None) -> ShardResult:
    """Per-rank memory of `est`'s step under cfg's world size, strategy and tensor-parallel degree."""
    cfg = cfg or est.config
    plan = plan_for(cfg)
    notes: list[str] = []
    f = plan.factors
    training = cfg.training
    b = est.breakdown_at_peak
    full_params = max((p.by_category.get("parameters", 0) for p in est.timeline), default=b.get("parameters", 0))
    full_grads = max((p.by_category.get("gradients", 0) for p in est.timeline), default=b.get("gradients", 0))
    unit = _unit_bytes(est, full_params) // plan.tp if plan.sharded["parameters"] else 0
    grad_ratio = full_grads / full_params if full_params else 0.0
    s = plan.shard_degree

    ddp_buckets = 0
    if plan.strategy == "ddp" and plan.dp > 1 and training and full_grads:
        # gradient_as_bucket_view=False (the default): the reducer's flat buckets copy every gradient
        ddp_buckets = int(full_grads / plan.tp)
        notes.append(
            f"DDP keeps gradient buckets ({DDP_BUCKET_CAP // 1024**2} MiB each) as large as all gradients; "
            "gradient_as_bucket_view=True removes that copy"
        )
    gathered = 0
    if plan.sharded["parameters"] and s > 1:
        gathered = int(min(PREFETCH_UNITS * unit, full_params / plan.tp) * (1 - 1 / s))
        notes.append(
            f"{plan.strategy}: parameters all-gathered one unit at a time ({unit} bytes per unit, "
            f"{PREFETCH_UNITS} units with prefetch) during forward and backward"
        )
    unsharded_grads = 0
    if plan.sharded["gradients"] and s > 1 and training:
        unsharded_grads = int(unit * grad_ratio * (1 - 1 / s)) if unit else 0
    if plan.tp > 1:
        notes.append(f"tensor parallelism {plan.tp}: weights and activations split (sequence parallelism assumed)")
    if plan.strategy == "fsdp-hybrid" and plan.dp > GPUS_PER_NODE:
        notes.append(f"fsdp-hybrid: sharded over {s} GPUs of a node, replicated across {plan.dp // s} nodes")

    amounts = {"ddp_buckets": ddp_buckets, "gathered": gathered, "unsharded_grads": unsharded_grads}
    best = None
    for p in est.timeline:
        by_cat, extras = _rank_point(p, f, amounts)
        total = sum(by_cat.values())
        if best is None or total > best[0]:
            best = (total, p, by_cat, extras)
    if best is None:
        raise UserError("the estimate has no timeline to shard")
    total, point, breakdown, extras = best
    states = sum(int(b.get(c, 0) * f[c]) for c in STATES)
    return ShardResult(
        plan=plan,
        peak_bytes=total,
        peak_index=point.index,
        peak_phase=point.phase,
        breakdown_at_peak=breakdown,
        model_state_bytes=states,
        extras_at_peak=extras,
        unit_parameter_bytes=unit,
        notes=tuple(notes),
        amounts=amounts,
    )


def _rank_point(p: TimelinePoint, factors: dict[str, float], amounts: dict[str, int]
                ) -> tuple[dict[str, int], dict[str, int]]:
    """One timeline point as a rank sees it: categories scaled, the strategy's extra buffers folded in."""
    by_cat = {c: int(v * factors.get(c, 1.0)) for c, v in p.by_category.items()}
    if p.phase == "optimizer":
        # The optimizer's temporaries (foreach intermediates) are per parameter: a rank steps only its shard.
        by_cat["temporaries"] = int(p.by_category.get("temporaries", 0) * factors.get("optimizer_state", 1.0))
    extras = {"ddp_buckets": amounts["ddp_buckets"], "gathered_parameters": 0, "unsharded_gradients": 0}
    if p.phase in ("forward", "backward"):
        extras["gathered_parameters"] = amounts["gathered"]
    if p.phase == "backward":
        extras["unsharded_gradients"] = amounts["unsharded_grads"]
    by_cat["gradients"] = by_cat.get("gradients", 0) + extras["ddp_buckets"] + extras["unsharded_gradients"]
    by_cat["parameters"] = by_cat.get("parameters", 0) + extras["gathered_parameters"]
    return by_cat, extras


def sharded_estimate(est: Estimate, cfg: TrainConfig | None = None) -> Estimate:
    """`est` as one rank sees it: peak and breakdown per rank, the plan in Estimate.sharding."""
    cfg = cfg or est.config
    if (cfg.world_size == 1 and cfg.tp == 1) or est.sharding is not None:
        return est  # single GPU, or already per rank
    r = shard(est, cfg)
    replayed = est.replay
    point = next((p for p in est.timeline if p.index == r.peak_index), None)
    timeline = tuple(
        replace(p, by_category=_rank_point(p, r.plan.factors, r.amounts)[0]) for p in est.timeline
    )
    gpu = est.gpu
    if gpu is not None:
        # the allocator's overhead over live tensors is kept; what a rank does not hold is taken off the reserve
        reserved = max(r.peak_bytes, gpu.reserved_bytes - (est.peak_bytes - r.peak_bytes))
        smi = gpu.nvidia_smi_bytes - (gpu.reserved_bytes - reserved)
        res_tl = gpu.reserved_timeline
        if len(res_tl) == len(timeline):
            res_tl = tuple(max(new.total, old_r - (old.total - new.total))
                           for old_r, old, new in zip(gpu.reserved_timeline, est.timeline, timeline, strict=False))
        spec = cfg.gpu_spec
        usable = spec.usable_bytes if spec is not None else None
        # nvidia-smi's split at the live peak, per rank: the tensors by their category's share, the rest as before
        split = {c: int(v * r.plan.factors.get(c, 1.0)) for c, v in gpu.breakdown_at_live_peak.items()
                 if c not in ("allocator_overhead", "cuda_context")}
        live_reserved = gpu.reserved_at_live_peak_bytes - (gpu.reserved_bytes - reserved)
        if gpu.breakdown_at_live_peak:
            split["allocator_overhead"] = max(0, live_reserved - sum(split.values()))
            live_reserved = sum(split.values())
            split["cuda_context"] = gpu.cuda_context_bytes
        if live_reserved > reserved:  # the reserve never holds less than what is live in it
            reserved = live_reserved
            smi = reserved + gpu.cuda_context_bytes
        shift = smi - gpu.nvidia_smi_bytes
        if replayed is not None:
            replayed = replace(replayed, max_memory_allocated=max(
                r.peak_bytes, replayed.max_memory_allocated - (est.peak_bytes - r.peak_bytes)))
        live_allocated = replayed.max_memory_allocated if replayed is not None else r.peak_bytes
        high = gpu.nvidia_smi_high_bytes + shift
        verdict, reason = gpu.verdict, gpu.verdict_reason
        if spec is not None and usable:
            verdict, reason = fit_verdict(gpu_name=spec.name, usable=usable, smi=smi, high=high,
                                          live=live_allocated,
                                          context=gpu.cuda_context_bytes)
            reason += " (per rank, from the single-GPU replay rescaled)"
        gpu = replace(
            gpu,
            breakdown_at_live_peak=split,
            reserved_at_live_peak_bytes=live_reserved,
            cached_free_bytes=max(0, live_reserved - live_allocated),
            nvidia_smi_low_bytes=max(0, gpu.nvidia_smi_low_bytes + shift),
            nvidia_smi_high_bytes=high,
            reserved_bytes=reserved,
            nvidia_smi_bytes=smi,
            fits=(verdict != "does not fit") if usable else gpu.fits,
            margin_bytes=(usable - smi) if usable else gpu.margin_bytes,
            reserved_timeline=res_tl,
            verdict=verdict,
            verdict_reason=reason,
        )
    return replace(
        est,
        gpu=gpu,
        timeline=timeline,
        config=cfg,
        peak_bytes=r.peak_bytes,
        peak_index=r.peak_index,
        peak_phase=r.peak_phase,
        peak_step=point.step if point else est.peak_step,
        peak_module=point.module if point else est.peak_module,
        peak_op=point.op if point else est.peak_op,
        breakdown_at_peak=r.breakdown_at_peak,
        # The single-GPU replay's out-of-memory point does not hold per rank.
        notes=tuple(n for n in est.notes if not n.startswith("out of memory on ")) + r.notes,
        sharding=r.figures(est.peak_bytes),
        replay=replayed,
    )


def rank_trace(trace: Trace, single: Estimate, cfg: TrainConfig) -> tuple[Trace, dict[int, list[tuple[int, str]]]]:
    """The trace as one rank allocates it: each storage scaled by its category's per-rank share, and the strategy's
    buffers as extra allocations {position: [(±nbytes, category), …]} (+ made before that event, − freed), so the
    allocator can be replayed per rank instead of scaling the single-GPU reserve."""
    r = shard(single, cfg)
    f, amounts = r.plan.factors, r.amounts
    events = []
    for e in trace.events:
        factor = f.get(e.category, 1.0)
        if e.phase == "optimizer" and e.category == "temporaries":
            factor = f.get("optimizer_state", 1.0)
        n = int(abs(e.nbytes) * factor)
        n = n if e.nbytes > 0 else -n
        # an event a rank makes whole (activations, most often) is the same event: kept, not made again
        events.append(e if n == e.nbytes else MemEvent(e.index, e.storage, n, e.category, e.step, e.phase,
                                                       e.module, e.op))
    extra: dict[int, list[tuple[int, str]]] = {}
    spans: list[tuple[int, str, int, int]] = []  # (step, phase, first, last)
    for i, e in enumerate(trace.events):
        if spans and spans[-1][0] == e.step and spans[-1][1] == e.phase:
            spans[-1] = (e.step, e.phase, spans[-1][2], i)
        else:
            spans.append((e.step, e.phase, i, i))
    ddp_done = False
    for _step, phase, first, last in spans:
        held = []
        if phase in ("forward", "backward") and amounts["gathered"]:
            held.append((amounts["gathered"], "parameters"))
        if phase == "backward" and amounts["unsharded_grads"]:
            held.append((amounts["unsharded_grads"], "gradients"))
        if phase == "backward" and amounts["ddp_buckets"] and not ddp_done:
            extra.setdefault(first, []).append((amounts["ddp_buckets"], "gradients"))
            ddp_done = True
        for n, cat in held:
            extra.setdefault(first, []).append((n, cat))
            if last + 1 < len(events):
                extra.setdefault(last + 1, []).append((-n, cat))
    return Trace(events=tuple(events), source=trace.source, device=trace.device), extra
