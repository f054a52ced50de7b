"""The transforms a configuration applies to a built model before it is traced or run: quantized weights
(engine.finetune.quantized), then LoRA adapters (engine.finetune.adapters). Shared by the tracer and the real
profiler."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..config.train_config import TrainConfig
from ..finetune.adapters import apply_lora
from ..finetune.quantized import quantize_linears
from .step import DTYPES


@dataclass
class Transformed:
    base_parameters: int  # the base model's parameters before quantization (logical count)
    adapter_parameters: int = 0
    notes: list[str] = field(default_factory=list)
    modelled: list[str] = field(default_factory=list)  # figures resting on a model of a library, not a run


def _count(model: nn.Module, trainable: bool | None = None) -> int:
    seen: set[int] = set()
    n = 0
    for p in model.parameters():
        if id(p) not in seen and (trainable is None or p.requires_grad == trainable):
            seen.add(id(p))
            n += p.numel()
    return n


def compute_dtype(cfg: TrainConfig) -> torch.dtype:
    """The dtype quantized layers dequantize to: the precision's half type, else bfloat16 (the QLoRA recipe's
    bnb_4bit_compute_dtype) for nf4/fp4/fp8, and float16 for int8 (LLM.int8 computes in fp16)."""
    if cfg.precision in DTYPES:
        return DTYPES[cfg.precision]
    return torch.float16 if cfg.weight_format == "int8" else torch.bfloat16


def apply_transforms(model: nn.Module, cfg: TrainConfig) -> Transformed | None:
    fmt = cfg.weight_format
    paged = cfg.training and cfg.optimizer == "paged-adamw8bit"  # an inference pass runs no optimizer
    if fmt is None and cfg.peft is None and not paged:
        return None
    out = Transformed(base_parameters=_count(model))
    cuda = cfg.device == "cuda"
    if fmt is not None:
        cd = compute_dtype(cfg)
        names = quantize_linears(model, fmt, cd, cuda)
        what = {"nf4": "bitsandbytes 4-bit NF4", "fp4": "bitsandbytes 4-bit FP4", "int8": "bitsandbytes LLM.int8",
                "fp8": "float8 e4m3 (per-row scale)"}[fmt]
        extra = ", double quantization" if fmt in ("nf4", "fp4") else ""
        out.notes.append(f"{len(names)} Linear layers stored as {what}{extra}, computing in "
                         f"{str(cd).removeprefix('torch.')}; the output layer and other layers keep their dtype")
        if fmt == "fp8":
            out.modelled.append("fp8 weights: float8 storage with per-row scales, dequantized per layer in "
                                "forward and backward (torchao's weight-only layout); no library kernel ran")
        elif fmt == "int8" and cuda:
            out.modelled.append("int8 weights on CUDA: bitsandbytes' CUDA path (MatMul8bitLt) traced with its "
                                "fake kernels; its kernels' own scratch is not known")
        elif cuda:
            out.modelled.append("4-bit matmuls on CUDA: up to 1536 rows bitsandbytes runs a fused kernel (its "
                                "scratch not known); above, it dequantizes the weight per layer, as traced")
    if cfg.peft is not None:
        for p in model.parameters():
            p.requires_grad_(False)
        targets = apply_lora(model, cfg)
        out.adapter_parameters = _count(model, trainable=True)
        out.notes.append(f"{cfg.peft.upper()} (peft): rank {cfg.lora_rank}, alpha {cfg.lora_alpha or 2 * cfg.lora_rank}"
                         f", on {', '.join(targets)}; {out.adapter_parameters:,} trainable adapter parameters, "
                         "the base frozen (no gradients, no optimizer state)")
    if paged:
        out.modelled.append("paged-adamw8bit: the 8-bit state lives in CUDA unified memory; counted as resident "
                            "on the GPU during the step (under memory pressure the driver pages it to host)")
    return out
