"""The training step (or inference pass) that is measured, shared by the tracer and the real profiler."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from ..config.optimizers import OPTIMIZER_TABLE
from ..config.train_config import TrainConfig
from ..core.bookkeeping import bookkeeping
from ..core.errors import UserError
from ..core.library_noise import quiet_libraries
from ..core.tensor_tree import map_tensors
from .text_generation import run_generation

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}
STEPS = 2  # the second step is the steady state: optimizer state already exists


def make_optimizer(params: Iterable[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer | None:
    """The torch optimizer engine.config.optimizers' entry for cfg.optimizer names (None: no optimizer step)."""
    spec = OPTIMIZER_TABLE[cfg.optimizer]
    if spec.torch_class is None or not cfg.training:
        return None
    with bookkeeping():  # (the constructor reads each parameter: no op of the model's)
        trained = [p for p in params if p.requires_grad]
        if not trained:
            return None
        if spec.library == "bitsandbytes":
            return _bitsandbytes_optimizer(trained, spec.torch_class)
        kw: dict[str, Any] = dict(spec.kwargs)
        # On CUDA, PyTorch defaults to the multi-tensor (foreach) path; on the CPU to the per-tensor loop.
        if cfg.fused and spec.fused:
            kw["fused"] = True
        else:
            kw["foreach"] = cfg.device == "cuda"
        optimizer_class: type[torch.optim.Optimizer] = getattr(torch.optim, spec.torch_class)
        return optimizer_class(trained, **kw)


def _bitsandbytes_optimizer(params: list[nn.Parameter], class_name: str | None) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW8bit / PagedAdamW8bit: two uint8 states per parameter with one float32 absmax per
    256-value block, and float32 states for tensors under 4096 values (the library's min_8bit_size). The
    constructor builds its quantization maps from values, outside fake mode (two real 1 KiB tensors)."""
    quiet_libraries()
    try:
        import bitsandbytes as bnb
    except ImportError as e:
        raise UserError(f"8-bit optimizers need bitsandbytes: pip install bitsandbytes ({e})") from None
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    cls: Callable[[list[nn.Parameter]], torch.optim.Optimizer] = getattr(bnb.optim, str(class_name))  # untyped
    # The trace runs on CPU tensors, where bitsandbytes falls back from paged memory and warns at every state.
    warnings.filterwarnings("ignore", message="Paged optimizers are not supported on CPU")
    with warnings.catch_warnings(), unset_fake_temporarily():
        warnings.simplefilter("ignore")  # "paged memory needs CUDA": the trace runs on CPU tensors
        return cls(params)


def call_model(model: nn.Module, inputs: Any) -> Any:
    """The model called on its example inputs (a dict as keywords, a tuple as arguments): whatever it returns."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def loss_of(out: object) -> torch.Tensor:
    """`out.loss` when the output has one (attribute or dict key), else the first tensor's sum."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss if loss.dim() == 0 else loss.sum()
    first = _first_tensor(out)
    if first is None:
        raise UserError("the model's output holds no tensor to take a loss from")
    return first.sum()


def _first_tensor(out: object) -> torch.Tensor | None:
    vals: Iterable[object]
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        vals = out.values()
    elif isinstance(out, (tuple, list)):
        vals = out
    elif hasattr(out, "to_tuple"):  # transformers' ModelOutput
        vals = out.to_tuple()
    else:
        return None
    for v in vals:
        t = _first_tensor(v)
        if t is not None:
            return t
    return None


def cast_inputs(inputs: Any, dtype: torch.dtype) -> Any:
    """The example inputs (a tensor, or a dict/tuple/list of them) with floating tensors cast to `dtype`."""
    return map_tensors(inputs, lambda t: t.to(dtype) if t.is_floating_point() else t)


def autocast_ctx(cfg: TrainConfig, device: str = "cpu") -> AbstractContextManager[Any]:
    """The forward's autocast, on the device the model's parameters are on (PyTorch's AMP recipe: the forward and
    the loss under autocast, the backward and the optimizer step outside it). Traced tensors live on the CPU
    device: the CPU autocast casts there, with CUDA's op lists applied for a CUDA target (engine.cuda.target);
    a real run on a GPU (benchmarks/validate_gpu.py, `vramscope calibrate`) autocasts on CUDA. (Its exit frees its
    weight casts in hash-map order: a recorder holds every autocast's exit in allocation order while it records,
    engine.trace.recorder.StorageRecorder.autocast_exits_in_allocation_order.)"""
    if not cfg.amp:
        return nullcontext()
    return torch.autocast(device, dtype=DTYPES[cfg.precision])


def _device_of(model: nn.Module) -> str:
    return next((p.device.type for p in model.parameters()), "cpu")


def _grad_scaler(model: nn.Module, cfg: TrainConfig, opt: torch.optim.Optimizer | None) -> torch.amp.GradScaler | None:
    """fp16 autocast trains with a GradScaler (bf16 needs none), as PyTorch's AMP recipe does."""
    if cfg.precision != "amp-fp16" or opt is None:
        return None
    return SteadyStateScaler(_device_of(model))


class SteadyStateScaler(torch.amp.GradScaler):
    """A GradScaler whose optimizer step always runs: the measured step is the steady state, where steps are
    not skipped for overflow (random weights and data overflow fp16 at the initial scale), and the inf check's
    `.item()` would force fake tensors to know values. The scaler's own tensors and unscaling are kept."""

    def _maybe_opt_step(self, optimizer: torch.optim.Optimizer, optimizer_state: dict[str, Any], *args: Any,
                        **kwargs: Any) -> float | None:
        loss: float | None = optimizer.step(*args, **kwargs)
        return loss


def phase_count(cfg: TrainConfig, steps: int = STEPS) -> int:
    """How many times run_steps calls set_phase: forward and backward per micro-batch, then the optimizer step
    (one forward per pass in inference); a progress bar counts them."""
    return steps * (2 * cfg.grad_accum + 1) if cfg.training else steps


def run_steps(
    model: nn.Module,
    inputs: Any,
    cfg: TrainConfig,
    set_phase: Callable[[int, str], None],
    after_backward: Callable[[], None] = lambda: None,
    after_optimizer: Callable[[torch.optim.Optimizer], None] = lambda opt: None,
    steps: int = STEPS,
    replay: Callable[[int], bool] | None = None,
    micro_steps: int | None = None,
    on_cache: Callable[[Any], None] = lambda cache: None,
    fast_forward: Callable[[Callable[[], Sequence[torch.Tensor]]], None] | None = None,
    optimizer_window: Callable[[torch.optim.Optimizer], AbstractContextManager[None]] | None = None,
) -> object:
    """Runs `steps` training steps (or inference passes) exactly as the CLI documents them.

    `replay(s)`, asked before each later step's forward, may reproduce that step's forward and backward from
    the previous one (engine.trace.step_replay) and return True; the optimizer step always runs.
    `micro_steps` (default: cfg.grad_accum) of the accumulation are run per step, the loss still divided by
    cfg.grad_accum (engine.trace.grad_accum copies the rest).
    Generation (cfg.mode "generate") runs engine.trace.text_generation's prefill and decode loop once instead,
    `on_cache` and
    `fast_forward` going to it. `optimizer_window(opt)` is held around each optimizer step and its zero_grad
    (engine.trace.folded_optimizer).
    Returns the optimizer (or the generation's KV cache), so that the caller decides when its state is released
    (after recording ends)."""
    device = _device_of(model)  # where the forward's autocast casts
    if cfg.generating:
        return run_generation(model, inputs, cfg, set_phase, on_cache, fast_forward,
                              autocast_ctx(cfg, device))
    if not cfg.training:
        model.eval()
        with torch.no_grad(), autocast_ctx(cfg, device):
            for s in range(steps):
                if s and replay is not None and replay(s):
                    continue
                set_phase(s, "forward")
                out = call_model(model, inputs)
                del out
        return None
    model.train()
    opt = make_optimizer(model.parameters(), cfg)
    scaler = _grad_scaler(model, cfg, opt)
    for s in range(steps):
        for _ in range(0 if s and replay is not None and replay(s) else (micro_steps or cfg.grad_accum)):
            set_phase(s, "forward")
            with autocast_ctx(cfg, device):
                out = call_model(model, inputs)
                loss = loss_of(out)
                if cfg.grad_accum > 1:
                    loss = loss / cfg.grad_accum
            del out
            set_phase(s, "backward")
            scaled = scaler.scale(loss) if scaler is not None else loss
            scaled.backward()  # type: ignore[no-untyped-call]  # Tensor.backward is unannotated in torch
            del scaled
            del loss
            after_backward()
        set_phase(s, "optimizer")
        if opt is not None:
            with optimizer_window(opt) if optimizer_window is not None else nullcontext():
                if scaler is not None:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
            after_optimizer(opt)
            with optimizer_window(opt) if optimizer_window is not None else nullcontext():
                opt.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
    return opt
