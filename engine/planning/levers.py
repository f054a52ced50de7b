"""The planner's levers for a training step, one function each: mixed precision, checkpointing, gradient
accumulation, a lighter (or 8-bit, or fused) optimizer, LoRA/QLoRA, sharding, a smaller input.

Each lever adds its Recommendations to a Planning (the step planned, how a configuration is estimated, what is
kept). A lever that changes only the optimizer is answered from the traced step where engine.planning.reuse can
(the forward and backward kept, the optimizer step traced); sharding from the traced step's categories; the
others trace the candidate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config.gpus import GpuSpec
from ..config.optimizers import OPTIMIZER_TABLE
from ..config.train_config import TrainConfig
from ..core.errors import Cancelled, UserError
from ..core.progress import CancelToken, Progress
from ..core.units import format_bytes
from ..models.source import ModelSource
from ..results.types import Estimate

Detail = str | Callable[[Estimate], str]


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


@dataclass
class Planning:
    """One plan under way: the step planned and its estimate, how a candidate is estimated (`run`: traced;
    `reuse`: from the traced step, None where it cannot be), and the recommendations kept so far.
    `quick`: only the answers that need no new forward/backward."""

    source: ModelSource
    cfg: TrainConfig
    base: Estimate
    run: Callable[[TrainConfig], Estimate]
    quick: bool = False
    reuse: Callable[[TrainConfig], Estimate | None] | None = None
    cancel: CancelToken | None = None
    progress: Progress | None = None
    out: list[Recommendation] = field(default_factory=list)
    ticks: int = 0

    @property
    def spec(self) -> GpuSpec | None:
        return self.cfg.gpu_spec

    def tick(self, what: str, steps: int = 8) -> None:
        self.ticks += 1
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled()
        if self.progress:
            self.progress(min(0.95, self.ticks / steps), what)

    def fits_of(self, est: Estimate) -> bool | None:
        return est.gpu.fits if (est.gpu is not None and self.spec is not None) else None

    @staticmethod
    def smi_of(est: Estimate) -> int | None:
        return est.gpu.nvidia_smi_bytes if est.gpu is not None else None

    def offer(self, title: str, detail: Detail, cost: str, new_cfg: TrainConfig, est: Estimate,
              changes_training: bool = False) -> None:
        """Keep the change when it saves bytes."""
        saves = self.base.peak_bytes - est.peak_bytes
        if saves > 0:
            self.out.append(Recommendation(title, detail(est) if callable(detail) else detail, saves,
                                           est.peak_bytes, cost, False, new_cfg, self.fits_of(est),
                                           self.smi_of(est), changes_training))

    def estimate(self, new_cfg: TrainConfig, reusable: bool = False) -> Estimate | None:
        """`new_cfg`'s estimate: from the traced step when `reusable` and engine.planning.reuse can, else traced (not in
        quick mode: None); None too when the candidate does not build or trace (it is then not offered)."""
        if reusable and self.reuse is not None:
            try:
                est = self.reuse(new_cfg)
            except (Cancelled, KeyboardInterrupt):
                raise
            except Exception:  # noqa: BLE001 - the reuse is a shortcut: where it fails, the full trace answers
                est = None
            if est is not None:
                return est
        if self.quick:
            return None
        try:
            return self.run(new_cfg)
        except (UserError, RuntimeError, ValueError, NotImplementedError):
            return None

    def traced(self, title: str, detail: Detail, cost: str, new_cfg: TrainConfig, changes_training: bool = False,
               reusable: bool = False) -> Estimate | None:
        """Estimate `new_cfg` and offer it; its estimate when it was kept."""
        est = self.estimate(new_cfg, reusable)
        if est is None:
            return None
        n = len(self.out)
        self.offer(title, detail, cost, new_cfg, est, changes_training)
        return est if len(self.out) > n else None


def estimate_of_config(source: ModelSource | str, cfg: TrainConfig, cancel: CancelToken | None = None) -> Estimate:
    """A candidate's estimate: traced, per rank when it shards."""
    from ..parallel.sharding import sharded_estimate
    from .estimator import estimate

    est = estimate(source, cfg, cancel=cancel)
    if cfg.world_size > 1 or cfg.tp > 1:
        est = sharded_estimate(est, cfg)
    return est


def supports_bf16(gpu: GpuSpec | None) -> bool:
    return gpu is None or gpu.compute_capability >= (8, 0)


def mixed_precision(p: Planning) -> None:
    if p.cfg.precision != "fp32":
        return
    if supports_bf16(p.spec):
        p.traced("Mixed precision (AMP bf16)", "torch.autocast(dtype=torch.bfloat16): matmuls and convolutions "
                 "run in bf16 and save bf16 activations; parameters stay fp32",
                 "none on Ampere or newer; bf16 has fewer mantissa bits", p.cfg.with_(precision="amp-bf16"))
    else:
        p.traced("Mixed precision (AMP fp16)", "torch.autocast(dtype=torch.float16) with a GradScaler",
                 "needs loss scaling (GradScaler); fp16 can overflow", p.cfg.with_(precision="amp-fp16"))


def checkpointing(p: Planning) -> None:
    if not p.cfg.training or p.cfg.checkpointing:
        return

    def detail(est: Estimate) -> str:
        blocks = est.checkpointed
        names = ", ".join(blocks[:4]) + (f" … ({len(blocks)} blocks)" if len(blocks) > 4 else "")
        return f"torch.utils.checkpoint around the repeated blocks: {names or 'none found'}"

    p.traced("Activation checkpointing", detail,
             "recomputes each checkpointed block's forward in backward: about +30 % step time",
             p.cfg.with_(checkpointing=True))


def accumulation(p: Planning) -> None:
    """The same effective batch in micro-batches: the largest micro-batch (a divisor of the batch) that fits the
    target GPU: the largest divisor first (a step that nearly fits answers in one trace), else by bisection over
    the others (the peak grows with the micro-batch); with no GPU named, two micro-batches. When none fits, the
    smallest (micro-batch 1), marked as not fitting."""
    cfg = p.cfg
    if not cfg.training or cfg.batch_size < 2 or p.quick:
        return
    micros = [d for d in range(1, cfg.batch_size) if cfg.batch_size % d == 0]  # ascending, below the batch
    tried: dict[int, Estimate | None] = {}

    def est_of(micro: int) -> Estimate | None:
        if micro not in tried:
            k = cfg.batch_size // micro
            tried[micro] = p.estimate(cfg.with_(batch_size=micro, grad_accum=cfg.grad_accum * k))
        return tried[micro]

    if p.spec is None:
        micro = micros[-1]  # two micro-batches when the batch is even, else the largest divisor's count
    else:
        lo, hi = 0, len(micros) - 1  # find the last index whose estimate fits
        best = None
        top = est_of(micros[hi])
        if top is not None and p.fits_of(top):
            best, lo = hi, hi + 1
        else:
            hi -= 1
        while lo <= hi:
            mid = (lo + hi) // 2
            est = est_of(micros[mid])
            if est is not None and p.fits_of(est):
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        micro = micros[best] if best is not None else micros[0]
    est = est_of(micro)
    if est is None:
        return
    k = cfg.batch_size // micro
    p.offer(f"Gradient accumulation ({k} micro-batches of {micro})",
            f"batch {micro} with --grad-accum {cfg.grad_accum * k}: the same effective batch of "
            f"{cfg.batch_size * cfg.grad_accum}",
            f"{k}× more forward/backward passes per optimizer step at a smaller batch (lower GPU utilisation)",
            cfg.with_(batch_size=micro, grad_accum=cfg.grad_accum * k), est)


def param_shapes(source: ModelSource, cfg: TrainConfig) -> list[tuple[int, ...]]:
    from ..trace.meta_build import build_on_meta

    model, _ = build_on_meta(source, cfg.with_(batch_size=1))
    seen: set[int] = set()
    shapes: list[tuple[int, ...]] = []
    for prm in model.parameters():
        if id(prm) in seen or not prm.requires_grad:
            continue
        seen.add(id(prm))
        shapes.append(tuple(prm.shape))
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


def optimizers(p: Planning) -> None:
    """A lighter optimizer, Adafactor's factored state (analytic), 8-bit AdamW, a fused step: each needs only the
    optimizer step traced again (engine.planning.reuse), so they are quick answers when the traced step is at hand."""
    cfg, base, spec = p.cfg, p.base, p.spec
    if not cfg.training:
        return
    opt_spec = OPTIMIZER_TABLE[cfg.optimizer]
    if opt_spec.adaptive:
        p.traced("SGD with momentum instead of " + cfg.optimizer,
                 "one momentum buffer per parameter instead of " +
                 ("two Adam moments" if opt_spec.two_moments else "the optimizer's state"),
                 "may need a new learning rate schedule; transformers usually train worse with SGD",
                 cfg.with_(optimizer="sgd-momentum"), reusable=True)
        opt_at_peak = base.breakdown_at_peak.get("optimizer_state", 0)
        if opt_spec.two_moments and opt_spec.state_bytes is None and opt_at_peak > 0:  # full-size moments
            try:
                shapes = param_shapes(p.source, cfg)
            except Exception:  # noqa: BLE001 - analytic figures are optional
                shapes = []
            if shapes:
                new_state = adafactor_state_bytes(shapes)
                saves = opt_at_peak - min(new_state, opt_at_peak)
                smi0 = p.smi_of(base)
                new_smi = smi0 - saves if smi0 else None
                if saves > 0:
                    p.out.append(Recommendation(
                        "Adafactor-style factored optimizer state (analytic)",
                        f"optimizer state {format_bytes(new_state)} instead of {format_bytes(opt_at_peak)} "
                        "at the peak; computed from the parameter shapes, not traced",
                        saves, base.peak_bytes - saves,
                        "different optimizer dynamics (no first moment); needs transformers/timm Adafactor", True,
                        None, (spec.usable_bytes >= new_smi) if (spec and new_smi is not None) else None, new_smi,
                    ))
        if opt_spec.eight_bit is not None:
            p.traced("8-bit AdamW (bitsandbytes)",
                     "bnb.optim.AdamW8bit: both moments in 8 bits with a float32 scale per 256 values (tensors "
                     "under 4096 values keep 32-bit state)", "needs bitsandbytes; a small accuracy risk",
                     cfg.with_(optimizer=opt_spec.eight_bit), reusable=True)
    # a fused optimizer step: no multi-tensor temporaries (on CUDA the default is foreach)
    if cfg.device == "cuda" and not cfg.fused and OPTIMIZER_TABLE[cfg.optimizer].fused:
        p.traced("Fused optimizer step (fused=True)",
                 f"torch.optim.{OPTIMIZER_TABLE[cfg.optimizer].torch_class}(..., fused=True) updates each "
                 "parameter in one kernel, without the foreach path's temporaries over all parameters at once",
                 "none on CUDA; the same update", cfg.with_(fused=True), reusable=True)


def fine_tuned(source: ModelSource, cfg: TrainConfig) -> bool:
    """Whether adapting pretrained weights is what people do with this model, so that freezing its base (LoRA,
    QLoRA) is advice worth giving: a Hugging Face model, or a language model (its inputs are token ids). A CNN or a
    sketch of images or features is trained from scratch: freezing its base would train something else."""
    import sys

    from ..models.hf_source import HFConfigSource
    from ..trace.meta_build import build_on_meta
    from ..trace.recorded_step import flat_tensors

    if isinstance(source, HFConfigSource):
        return True
    model, inputs = build_on_meta(source, cfg.with_(batch_size=1))
    tf = sys.modules.get("transformers")
    if tf is not None and isinstance(model, tf.PreTrainedModel):
        return True
    first = next(iter(flat_tensors(inputs)), None)
    return first is not None and not first.dtype.is_floating_point and not first.dtype.is_complex


def adapters(p: Planning) -> None:
    """Fine-tune adapters instead of the whole model (peft), on a 4-bit base (QLoRA). Only where fine-tuning a
    pretrained model is what people do: for a network trained from scratch they would train something else (a
    frozen random base), whatever bytes they save."""
    cfg = p.cfg
    if not (cfg.training and cfg.world_size == 1 and not p.quick and fine_tuned(p.source, cfg)):
        return
    changes = "changes what is trained: the base is frozen and only low-rank adapters learn"
    if cfg.peft is None:
        p.traced(f"LoRA adapters (rank {cfg.lora_rank}, peft)",
                 lambda est: f"--peft lora: the base frozen, {est.trainable_parameters:,} adapter parameters "
                 "trained (no gradients or optimizer state for the base)",
                 f"{changes} (fine-tuning a pretrained model, not training it)", cfg.with_(peft="lora"),
                 changes_training=True)
    if cfg.peft != "qlora" and cfg.weights is None:
        p.traced("QLoRA (4-bit NF4 base + LoRA)",
                 "--peft qlora: the frozen Linear weights in bitsandbytes 4-bit NF4 with double quantization, "
                 "dequantized per layer in forward and backward; adapters trained",
                 (f"{changes}, on a 4-bit base; " if cfg.peft is None else "") + "needs bitsandbytes and peft; "
                 "slower matmuls (dequantization); a small quality risk from 4 bits", cfg.with_(peft="qlora"),
                 changes_training=cfg.peft is None)


def sharding(p: Planning) -> None:
    """FSDP and ZeRO-2 over the fewest GPUs (2, 4 or 8) that fit the target, per rank from the traced step."""
    from ..parallel.sharding import sharded_estimate

    cfg, single, spec = p.cfg, p.base, p.spec
    if not cfg.training or cfg.world_size != 1 or cfg.tp != 1:
        return
    overhead = single.gpu.nvidia_smi_bytes - single.peak_bytes if single.gpu else None
    n = 2
    for n in (2, 4, 8):
        sh = sharded_estimate(single, cfg.with_(world_size=n, strategy="fsdp"))
        if spec is None or sh.peak_bytes + (overhead or 0) <= spec.usable_bytes:
            break
    for strategy, what, cost in (
        ("fsdp", "FSDP full sharding (ZeRO-3): parameters, gradients and optimizer state split",
         f"{n} GPUs; about 1.5× DDP's communication (parameters all-gathered in forward and backward)"),
        ("zero2", "ZeRO-2: gradients and optimizer state split, parameters replicated",
         f"{n} GPUs; the same communication volume as DDP"),
    ):
        scfg = cfg.with_(world_size=n, strategy=strategy)
        s_est = sharded_estimate(single, scfg)
        saves = single.peak_bytes - s_est.peak_bytes
        if saves > 0:
            smi = s_est.peak_bytes + overhead if overhead is not None else None
            p.out.append(Recommendation(
                f"{strategy.upper() if strategy == 'fsdp' else 'ZeRO-2'} across {n} GPUs",
                f"{what}; per-GPU batch {cfg.batch_size} (per-rank figure from the traced step)",
                saves, s_est.peak_bytes, cost, False, scfg,
                (smi <= spec.usable_bytes) if (spec and smi is not None) else None, smi,
            ))


def input_size(p: Planning) -> None:
    """Shorter sequences (text, not a generation: its prompt is offered with generation's levers) or smaller
    images (vision)."""
    from ..models.hf_source import HFConfigSource
    from ..models.sources import TemplateSource

    cfg, source = p.cfg, p.source
    info = source.info if isinstance(source, TemplateSource) else None  # a template knows its input's defaults
    hf = source if isinstance(source, HFConfigSource) and source.task != "speech-seq2seq" else None
    family = info.family if info is not None else (hf.family if hf is not None else None)
    if family == "text" and not cfg.generating:
        seq = cfg.seq_len or (info.default_seq_len if info is not None else hf.default_seq_len() if hf else None)
        if seq and seq >= 16:
            p.traced(f"Shorter sequences ({seq} → {seq // 2} tokens)",
                     f"--seq-len {seq // 2}: activations scale with the sequence length (attention with its square)",
                     "less context per sample; may change what the model can learn", cfg.with_(seq_len=seq // 2))
    elif family == "vision":
        size = cfg.image_size or (info.default_image_size if info is not None else None)
        if size and size >= 64:
            new = size // 2 // 16 * 16 or size // 2
            p.traced(f"Smaller images ({size} → {new} px)",
                     f"--image-size {new}: activations scale with the number of pixels",
                     "lower resolution; may cost accuracy", cfg.with_(image_size=new))
