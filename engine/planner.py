"""Questions answered over the estimator: the largest batch that fits a budget, and ranked changes that make a
model fit (AMP, checkpointing, accumulation, a lighter or 8-bit optimizer, LoRA/QLoRA, sharding, a smaller input),
each with the bytes
it saves — from a real re-estimate wherever the engine can trace the change, else an analytic figure, labelled so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .config import TrainConfig
from .errors import Cancelled, UserError
from .gpus import GpuSpec
from .model_source import ModelSource
from .optimizers import OPTIMIZER_TABLE
from .progress import CancelToken, Progress
from .results import Estimate
from .sources import TemplateSource
from .units import format_bytes

FIGURES = ("peak", "reserved", "nvidia_smi")


def _estimate(source: ModelSource | str, cfg: TrainConfig, cancel: CancelToken | None = None) -> Estimate:
    from .estimator import estimate
    from .sharding import sharded_estimate

    est = estimate(source, cfg, cancel=cancel)
    if cfg.world_size > 1 or cfg.tp > 1:
        est = sharded_estimate(est, cfg)
    return est


def _resolved(source: ModelSource | str) -> ModelSource:
    """`source` itself, or the model a name or path stands for."""
    if isinstance(source, str):
        from .sources import resolve_source

        return resolve_source(source)
    return source


def _stepper(source: ModelSource | str, cancel: CancelToken | None,
             estimator: Callable[[TrainConfig], Estimate] | None) -> Callable[[TrainConfig], Estimate]:
    """What answers a configuration's estimate: `estimator` where given, else a traced step of `source` (a name is
    resolved once, here)."""
    if estimator is not None:
        return estimator
    model = _resolved(source)
    return lambda c: _estimate(model, c, cancel)


def figure_of(est: Estimate, figure: str = "peak") -> int:
    """The number a budget is compared with: live tensor peak, predicted reserved, or predicted nvidia-smi."""
    if figure == "peak" or est.gpu is None:
        return est.peak_bytes
    if figure == "reserved":
        return est.gpu.reserved_bytes
    if figure == "nvidia_smi":
        return est.gpu.nvidia_smi_bytes
    raise UserError(f"unknown figure '{figure}'; choose one of: {', '.join(FIGURES)}")


def _check(cancel: CancelToken | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


@dataclass(frozen=True)
class _SearchResult:
    """What the max-batch and max-context results share: their fields as JSON, `tried` (the (value searched,
    figure) pair of every trace, in order) as lists of pairs."""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tried"] = [list(t) for t in d["tried"]]
        return d


# --------------------------------------------------------------------------------------------------- max batch


@dataclass(frozen=True)
class MaxBatchResult(_SearchResult):
    batch_size: int
    peak_bytes: int  # the compared figure at batch_size
    traces_run: int
    fits_at_next: bool  # always False: the estimate at batch_size + 1 exceeds the budget
    peak_next: int | None  # the figure at batch_size + 1 (None when the search stopped at max_batch_size)
    budget_bytes: int
    figure: str = "peak"
    tried: tuple[tuple[int, int], ...] = ()  # (batch, figure) of every trace, in order


def max_batch(
    source: ModelSource | str,
    cfg: TrainConfig,
    budget_bytes: int,
    *,
    cancel: CancelToken | None = None,
    progress: Progress | None = None,
    figure: str = "peak",
    max_batch_size: int = 1 << 20,
    estimator: Callable[[TrainConfig], Estimate] | None = None,
    knob: str = "batch_size",
    noun: str = "batch size",
    second: int = 2,
) -> MaxBatchResult:
    """Largest batch whose estimated figure ≤ budget (it fits at N, not at N+1), with few traces.

    Memory is nearly affine in the batch: fit it from two traces, jump to the prediction, then verify with
    exact traces at the answer and the answer + 1, refitting (or bisecting) if the prediction was off.
    `knob` names another TrainConfig field searched the same way (max_context: the prompt or sequence length),
    `noun` what it is called in messages, `second` the second value traced after 1.
    """
    if budget_bytes <= 0:
        raise UserError(f"the budget must be positive, got {budget_bytes} bytes", where="--budget")
    run = _stepper(source, cancel, estimator)
    values: dict[int, int] = {}
    order: list[tuple[int, int]] = []

    def value(b: int) -> int:
        if b not in values:
            _check(cancel)
            if progress:
                progress(min(0.95, 0.1 + 0.15 * len(values)), f"estimating {noun} {b}")
            values[b] = figure_of(run(cfg.with_(**{knob: b})), figure)
            order.append((b, values[b]))
        return values[b]

    p1 = value(1)
    if p1 > budget_bytes:
        raise UserError(
            f"even {noun} 1 does not fit: it needs {format_bytes(p1)}, "
            f"{format_bytes(p1 - budget_bytes)} more than the budget of {format_bytes(budget_bytes)}",
            where="max-batch" if knob == "batch_size" else "max-context",
        )
    lo, hi = 1, None  # lo fits, hi does not
    second = max(2, min(second, max_batch_size))
    if value(second) > budget_bytes:
        hi = second
    else:
        lo = second
    same_side, last_fits = 0, None  # consecutive guesses landing on the same side of the budget
    while (hi is None or hi - lo > 1) and lo < max_batch_size:
        (xa, ya), (xb, yb) = order[-2], order[-1]
        both_fit = ya <= budget_bytes and yb <= budget_bytes and xa != xb
        if hi is not None and (hi - lo <= 4 or same_side >= 3):
            guess = (lo + hi) // 2
        elif both_fit or hi is None:
            # extrapolate along the last two fitting traces: exact once both lie on the final affine stretch
            # (memory is a maximum of affine pieces in the batch, e.g. a constant optimizer-step peak)
            slope = (yb - ya) / (xb - xa) if xb != xa else 0.0
            guess = lo + math.floor((budget_bytes - values[lo]) / slope) if slope > 0 else lo * 8
            if hi is None:
                guess = min(guess, lo * 64)
        else:
            guess = lo + math.floor((budget_bytes - values[lo]) * (hi - lo) / (values[hi] - values[lo]))
        guess = max(lo + 1, min(guess, hi - 1 if hi is not None else max_batch_size))
        fits = value(guess) <= budget_bytes
        same_side = same_side + 1 if fits == last_fits else 0
        last_fits = fits
        if fits:
            lo = guess
        else:
            hi = guess
    if progress:
        progress(1.0, "done")
    return MaxBatchResult(
        batch_size=lo,
        peak_bytes=values[lo],
        traces_run=len(values),
        fits_at_next=False,
        peak_next=values.get(lo + 1),
        budget_bytes=budget_bytes,
        figure=figure,
        tried=tuple(order),
    )


# ------------------------------------------------------------------------------------------------- max context


@dataclass(frozen=True)
class MaxContextResult(_SearchResult):
    """The longest context that fits: prompt + new tokens when generating, else the sequence length."""

    context_tokens: int
    length: int  # the searched length: the prompt (generation) or the sequence
    new_tokens: int  # 0 unless generating
    peak_bytes: int  # the compared figure at that length
    peak_next: int | None  # at one token more (None when the model's positions stop there)
    limit: int | None  # the model's longest context (its position embeddings), when it has one
    traces_run: int
    budget_bytes: int
    figure: str = "peak"
    tried: tuple[tuple[int, int], ...] = ()


def max_context(
    source: ModelSource | str,
    cfg: TrainConfig,
    budget_bytes: int,
    *,
    cancel: CancelToken | None = None,
    progress: Progress | None = None,
    figure: str = "peak",
    limit: int | None = None,
    estimator: Callable[[TrainConfig], Estimate] | None = None,
) -> MaxContextResult:
    """Longest context whose estimated figure ≤ budget, at cfg's batch size: the prompt length with cfg.new_tokens
    generated after it (mode generate), else the sequence length. `limit`: the model's longest context."""
    new = cfg.new_tokens if cfg.generating else 0
    upper = (limit - new) if limit else 1 << 22
    if upper < 1:
        raise UserError(f"{new} new tokens already exceed the model's context of {limit} tokens",
                        where="--new-tokens")
    knob, noun = ("prompt_len", "prompt length") if cfg.generating else ("seq_len", "sequence length")
    r = max_batch(source, cfg, budget_bytes, cancel=cancel, progress=progress, figure=figure,
                  max_batch_size=upper, estimator=estimator, knob=knob, noun=noun, second=min(upper, 512))
    return MaxContextResult(
        context_tokens=r.batch_size + new,
        length=r.batch_size,
        new_tokens=new,
        peak_bytes=r.peak_bytes,
        peak_next=r.peak_next,
        limit=limit,
        traces_run=r.traces_run,
        budget_bytes=budget_bytes,
        figure=figure,
        tried=r.tried,
    )


# --------------------------------------------------------------------------------------------------- recommend


@dataclass(frozen=True)
class Recommendation:
    title: str
    detail: str
    saves_bytes: int
    new_peak_bytes: int
    cost: str
    analytic: bool = False  # True when the figure is computed from formulas, not a re-traced step
    config: TrainConfig | None = None  # the configuration that realises it (None for analytic ones)
    fits: bool | None = None  # on the target GPU, when one is named
    new_nvidia_smi_bytes: int | None = None
    # True when the change alters what is trained (LoRA/QLoRA freeze the base): ranked after the changes that keep
    # the training the same, and said so
    changes_training: bool = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["config"] = self.config.to_json() if self.config else None
        return d


def _param_shapes(source: ModelSource, cfg: TrainConfig) -> list[tuple[int, ...]]:
    import torch

    with torch.device("meta"):
        model, _ = source.build(cfg.with_(batch_size=1))
    seen: set[int] = set()
    shapes: list[tuple[int, ...]] = []
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        shapes.append(tuple(p.shape))
    return shapes


def adafactor_state_bytes(shapes: Iterable[Sequence[int]]) -> int:
    """Adafactor without momentum (β1 = None), fp32 factored second moments: rows + columns of each matrix."""
    total = 0
    for s in shapes:
        if len(s) >= 2:
            lead = math.prod(s[:-2]) if len(s) > 2 else 1
            total += 4 * lead * (s[-2] + s[-1])
        else:
            total += 4 * math.prod(s)
    return total


def fine_tuned(source: ModelSource, cfg: TrainConfig) -> bool:
    """Whether adapting pretrained weights is what people do with this model, so that freezing its base (LoRA,
    QLoRA) is advice worth giving: a Hugging Face model, or a language model (its inputs are token ids). A CNN or a
    sketch of images or features is trained from scratch: freezing its base would train something else."""
    import sys

    import torch

    from .hf_source import HFConfigSource
    from .recorded_step import flat_tensors

    if isinstance(source, HFConfigSource):
        return True
    with torch.device("meta"):
        model, inputs = source.build(cfg.with_(batch_size=1))
    tf = sys.modules.get("transformers")
    if tf is not None and isinstance(model, tf.PreTrainedModel):
        return True
    first = next(iter(flat_tensors(inputs)), None)
    return first is not None and not first.dtype.is_floating_point and not first.dtype.is_complex


def _supports_bf16(gpu: GpuSpec | None) -> bool:
    return gpu is None or gpu.compute_capability >= (8, 0)


MIN_SAVING_FRACTION = 0.01  # recommendations saving less than this share of the peak are not offered


def recommend(
    source: ModelSource | str,
    cfg: TrainConfig,
    *,
    cancel: CancelToken | None = None,
    progress: Progress | None = None,
    base: Estimate | None = None,
    estimator: Callable[[TrainConfig], Estimate] | None = None,
    quick: bool = False,
) -> list[Recommendation]:
    """Changes that lower the step's peak, ranked by the bytes they save (most first).

    `quick`: only the answers that need no new trace (a lighter optimizer's state from the parameter shapes,
    sharding from the traced step), in about the time it takes to build the model on meta: the app shows them
    first, while the traced answers (AMP, checkpointing, accumulation, …) are worked out. The target GPU is
    cfg's (`cfg.gpu_spec`, resolved when the configuration was built)."""
    from .sharding import sharded_estimate

    source = _resolved(source)
    spec = cfg.gpu_spec
    run = _stepper(source, cancel, estimator)
    base = base or run(cfg)
    peak0 = base.peak_bytes
    out: list[Recommendation] = []
    steps = 8  # progress ticks
    done = [0]

    def tick(what: str) -> None:
        done[0] += 1
        _check(cancel)
        if progress:
            progress(min(0.95, done[0] / steps), what)

    def fits_of(est: Estimate) -> bool | None:
        return est.gpu.fits if (est.gpu is not None and spec is not None) else None

    def smi_of(est: Estimate) -> int | None:
        return est.gpu.nvidia_smi_bytes if est.gpu is not None else None

    def offer(title: str, detail: str | Callable[[Estimate], str], cost: str, new_cfg: TrainConfig,
              est: Estimate, changes_training: bool = False) -> None:
        saves = peak0 - est.peak_bytes
        if saves > 0:
            out.append(Recommendation(title, detail(est) if callable(detail) else detail, saves, est.peak_bytes,
                                      cost, False, new_cfg, fits_of(est), smi_of(est), changes_training))

    def traced(title: str, detail: str | Callable[[Estimate], str], cost: str,
               new_cfg: TrainConfig, changes_training: bool = False) -> Estimate | None:
        if quick:
            return None
        try:
            est = run(new_cfg)
        except (UserError, RuntimeError, ValueError, NotImplementedError):
            return None
        n = len(out)
        offer(title, detail, cost, new_cfg, est, changes_training)
        return est if len(out) > n else None

    training = cfg.training
    # 1. mixed precision
    tick("mixed precision")
    if cfg.precision == "fp32":
        if _supports_bf16(spec):
            traced("Mixed precision (AMP bf16)", "torch.autocast(dtype=torch.bfloat16): matmuls and convolutions "
                   "run in bf16 and save bf16 activations; parameters stay fp32",
                   "none on Ampere or newer; bf16 has fewer mantissa bits", cfg.with_(precision="amp-bf16"))
        else:
            traced("Mixed precision (AMP fp16)", "torch.autocast(dtype=torch.float16) with a GradScaler",
                   "needs loss scaling (GradScaler); fp16 can overflow", cfg.with_(precision="amp-fp16"))
    # 2. activation checkpointing
    tick("activation checkpointing")
    if training and not cfg.checkpointing:
        def ck_detail(est: Estimate) -> str:
            blocks = est.checkpointed
            names = ", ".join(blocks[:4]) + (f" … ({len(blocks)} blocks)" if len(blocks) > 4 else "")
            return f"torch.utils.checkpoint around the repeated blocks: {names or 'none found'}"

        traced("Activation checkpointing", ck_detail,
               "recomputes each checkpointed block's forward in backward: about +30 % step time",
               cfg.with_(checkpointing=True))
    # 3. gradient accumulation, same effective batch
    tick("gradient accumulation")
    if training and cfg.batch_size >= 2:
        kept = None
        for k in [d for d in range(2, cfg.batch_size + 1) if cfg.batch_size % d == 0][:3]:
            micro = cfg.batch_size // k
            n_before = len(out)
            est = traced(
                f"Gradient accumulation ({k} micro-batches of {micro})",
                f"batch {micro} with --grad-accum {cfg.grad_accum * k}: the same effective batch of "
                f"{cfg.batch_size * cfg.grad_accum}",
                f"{k}× more forward/backward passes per optimizer step at a smaller batch (lower GPU utilisation)",
                cfg.with_(batch_size=micro, grad_accum=cfg.grad_accum * k),
            )
            rec = out.pop() if len(out) > n_before else None
            if rec is not None:
                kept = rec
            # the smallest accumulation that fits the GPU (or simply 2 micro-batches when none is named)
            if spec is None or (est is not None and fits_of(est)):
                break
        if kept is not None:
            out.append(kept)
    # 4. lighter optimizers
    tick("optimizer")
    opt_spec = OPTIMIZER_TABLE[cfg.optimizer]
    if training and opt_spec.adaptive:
        traced("SGD with momentum instead of " + cfg.optimizer,
               "one momentum buffer per parameter instead of " +
               ("two Adam moments" if opt_spec.two_moments else "the optimizer's state"),
               "may need a new learning rate schedule; transformers usually train worse with SGD",
               cfg.with_(optimizer="sgd-momentum"))
        opt_at_peak = base.breakdown_at_peak.get("optimizer_state", 0)
        if opt_spec.two_moments and opt_spec.state_bytes is None and opt_at_peak > 0:  # full-size moments
            try:
                shapes = _param_shapes(source, cfg)
            except Exception:  # noqa: BLE001 - analytic figures are optional
                shapes = []
            if shapes:
                for title, new_state, cost in (
                    ("Adafactor-style factored optimizer state (analytic)", adafactor_state_bytes(shapes),
                     "different optimizer dynamics (no first moment); needs transformers/timm Adafactor"),
                ):
                    saves = opt_at_peak - min(new_state, opt_at_peak)
                    smi0 = smi_of(base)
                    new_smi = smi0 - saves if smi0 else None
                    if saves > 0:
                        out.append(Recommendation(
                            title,
                            f"optimizer state {format_bytes(new_state)} instead of {format_bytes(opt_at_peak)} "
                            "at the peak; computed from the parameter shapes, not traced",
                            saves, peak0 - saves, cost, True, None,
                            (spec.usable_bytes >= new_smi) if (spec and new_smi is not None) else None,
                            new_smi,
                        ))
        if opt_spec.eight_bit is not None:
            traced("8-bit AdamW (bitsandbytes)",
                   "bnb.optim.AdamW8bit: both moments in 8 bits with a float32 scale per 256 values (tensors under "
                   "4096 values keep 32-bit state)", "needs bitsandbytes; a small accuracy risk",
                   cfg.with_(optimizer=opt_spec.eight_bit))
    # 4b. a fused optimizer step: no multi-tensor temporaries (on CUDA the default is foreach)
    if training and cfg.device == "cuda" and not cfg.fused and OPTIMIZER_TABLE[cfg.optimizer].fused:
        traced("Fused optimizer step (fused=True)",
               f"torch.optim.{OPTIMIZER_TABLE[cfg.optimizer].torch_class}(..., fused=True) updates each "
               "parameter in one kernel, without the foreach path's temporaries over all parameters at once",
               "none on CUDA; the same update", cfg.with_(fused=True))
    # 4c. fine-tune adapters instead of the whole model (peft), on a 4-bit base (QLoRA)
    # Only where fine-tuning a pretrained model is what people do: for a network trained from scratch they would
    # train something else (a frozen random base), whatever bytes they save.
    tick("LoRA / QLoRA")
    adapt = training and cfg.world_size == 1 and not quick and fine_tuned(source, cfg)
    changes = "changes what is trained: the base is frozen and only low-rank adapters learn"
    if adapt and cfg.peft is None:
        traced(f"LoRA adapters (rank {cfg.lora_rank}, peft)",
               lambda est: f"--peft lora: the base frozen, {est.trainable_parameters:,} adapter parameters trained "
               "(no gradients or optimizer state for the base)",
               f"{changes} (fine-tuning a pretrained model, not training it)", cfg.with_(peft="lora"),
               changes_training=True)
    if adapt and cfg.peft != "qlora" and cfg.weights is None:
        traced("QLoRA (4-bit NF4 base + LoRA)",
               "--peft qlora: the frozen Linear weights in bitsandbytes 4-bit NF4 with double quantization, "
               "dequantized per layer in forward and backward; adapters trained",
               (f"{changes}, on a 4-bit base; " if cfg.peft is None else "") + "needs bitsandbytes and peft; slower "
               "matmuls (dequantization); a small quality risk from 4 bits", cfg.with_(peft="qlora"),
               changes_training=cfg.peft is None)
    if not training and not quick:
        from .generation_advice import generation_levers

        tick("generation" if cfg.generating else "inference")
        generation_levers(source, cfg, base, run, offer, lambda: _longest_prompt(source, cfg, run))
    # 5. sharding across GPUs
    tick("sharding")
    if training and cfg.world_size == 1 and cfg.tp == 1:
        single = base
        chosen = None
        for n in (2, 4, 8):
            scfg = cfg.with_(world_size=n, strategy="fsdp")
            sh = sharded_estimate(single, scfg)
            chosen = (n, sh)
            need = sh.peak_bytes + (single.gpu.nvidia_smi_bytes - single.peak_bytes if single.gpu else 0)
            if spec is None or need <= spec.usable_bytes:
                break
        if chosen:
            n, sh = chosen
            for strategy, what, cost in (
                ("fsdp", "FSDP full sharding (ZeRO-3): parameters, gradients and optimizer state split",
                 f"{n} GPUs; about 1.5× DDP's communication (parameters all-gathered in forward and backward)"),
                ("zero2", "ZeRO-2: gradients and optimizer state split, parameters replicated",
                 f"{n} GPUs; the same communication volume as DDP"),
            ):
                scfg = cfg.with_(world_size=n, strategy=strategy)
                s_est = sharded_estimate(single, scfg)
                saves = peak0 - s_est.peak_bytes
                if saves > 0:
                    overhead = single.gpu.nvidia_smi_bytes - single.peak_bytes if single.gpu else None
                    smi = s_est.peak_bytes + overhead if overhead is not None else None
                    out.append(Recommendation(
                        f"{strategy.upper() if strategy == 'fsdp' else 'ZeRO-2'} across {n} GPUs",
                        f"{what}; per-GPU batch {cfg.batch_size} (per-rank figure from the traced step)",
                        saves, s_est.peak_bytes, cost, False, scfg,
                        (smi <= spec.usable_bytes) if (spec and smi is not None) else None, smi,
                    ))
    # 6. a smaller input
    tick("input size")
    from .hf_source import HFConfigSource

    info = source.info if isinstance(source, TemplateSource) else None  # a template knows its input's defaults
    hf = source if isinstance(source, HFConfigSource) and source.task != "speech-seq2seq" else None
    family = info.family if info is not None else (hf.family if hf is not None else None)
    if family == "text" and not cfg.generating:  # a generation's prompt is offered above
        seq = cfg.seq_len or (info.default_seq_len if info is not None else hf.default_seq_len() if hf else None)
        if seq and seq >= 16:
            traced(f"Shorter sequences ({seq} → {seq // 2} tokens)",
                   f"--seq-len {seq // 2}: activations scale with the sequence length (attention with its square)",
                   "less context per sample; may change what the model can learn", cfg.with_(seq_len=seq // 2))
    elif family == "vision":
        size = cfg.image_size or (info.default_image_size if info is not None else None)
        if size and size >= 64:
            new = size // 2 // 16 * 16 or size // 2
            traced(f"Smaller images ({size} → {new} px)",
                   f"--image-size {new}: activations scale with the number of pixels",
                   "lower resolution; may cost accuracy", cfg.with_(image_size=new))
    tick("ranking")
    # A change that saves almost nothing here (the peak lies elsewhere) is not worth its cost: left out.
    out = [r for r in out if r.saves_bytes >= MIN_SAVING_FRACTION * peak0]
    # The changes that keep the training the same first, those that change what is trained after them.
    out.sort(key=lambda r: (r.changes_training, -r.saves_bytes))
    if progress:
        progress(1.0, "done")
    return out


def _longest_prompt(source: ModelSource, cfg: TrainConfig, run: Callable[[TrainConfig], Estimate]) -> int | None:
    """The longest prompt whose predicted nvidia-smi figure fits the target (None: not even one token does)."""
    from .hf_source import HFConfigSource

    spec = cfg.gpu_spec
    if spec is None:
        return None
    limit = source.context_limit() if isinstance(source, HFConfigSource) else None
    try:
        r = max_context(source, cfg, spec.usable_bytes, figure="nvidia_smi", limit=limit, estimator=run)
    except UserError:
        return None
    return r.length
