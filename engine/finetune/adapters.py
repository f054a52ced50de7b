"""PEFT as a transform of a built model: LoRA adapters injected by the real `peft` library (get_peft_model),
on the meta device for the tracer or for real for the profiler. The base is frozen; only adapters train.
"""

from __future__ import annotations

import difflib
from types import ModuleType

import torch
from torch import nn

from ..config.train_config import TrainConfig
from ..core.errors import UserError
from ..core.library_noise import quiet_libraries
from .quantized import load_bitsandbytes, output_layer_names

ADAPTER_MARKERS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.", ".lora_magnitude_vector.")


def _peft() -> ModuleType:
    quiet_libraries()  # peft imports bitsandbytes, and calls a name transformers deprecates
    try:
        import peft
    except ImportError as e:
        raise UserError(f"--peft needs the peft library: pip install peft ({e})") from None
    return peft


def import_libraries(peft_kind: str) -> None:
    """Import what an estimate with `peft_kind` ("lora", "qlora") adapters will: peft (and transformers with it),
    and bitsandbytes' layers for QLoRA (a plan does this once before it forks its workers, which then share it)."""
    _peft()
    if peft_kind == "qlora":
        load_bitsandbytes()


def linear_names(model: nn.Module) -> dict[str, list[str]]:
    """Each Linear's last name component (what LoRA targets name) -> the full module paths carrying it."""
    out: dict[str, list[str]] = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and name:
            out.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return out


def default_targets(model: nn.Module) -> list[str]:
    """peft's own default for the model's Hugging Face type (q_proj, v_proj for Llama), else q_proj/v_proj
    when the model has them (as Llama-shaped templates do), else every Linear but the output layer."""
    from peft.utils.constants import (
        TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as BY_TYPE,
    )

    model_type = getattr(getattr(model, "config", None), "model_type", None)  # a Hugging Face model's config
    names = linear_names(model)
    if isinstance(model_type, str) and model_type in BY_TYPE:
        wanted = [t for t in BY_TYPE[model_type] if t in names]
        if wanted:
            return wanted
    if "q_proj" in names and "v_proj" in names:
        return ["q_proj", "v_proj"]
    return all_linear(model)


def all_linear(model: nn.Module) -> list[str]:
    skip = output_layer_names(model)
    names = linear_names(model)
    return sorted(k for k, paths in names.items() if any(p not in skip for p in paths))


def resolve_targets(model: nn.Module, spec: str | None) -> list[str]:
    if spec is None or not spec.strip():
        return default_targets(model)
    if spec.strip() == "all-linear":
        found = all_linear(model)
        if not found:
            raise UserError("--lora-targets all-linear: the model has no Linear layers besides its output layer")
        return found
    names = linear_names(model)
    wanted = [t.strip() for t in spec.split(",") if t.strip()]
    for t in wanted:
        if t not in names:
            close = difflib.get_close_matches(t, list(names), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UserError(f"--lora-targets: the model has no Linear named '{t}'{hint}; its Linear names: "
                            f"{', '.join(sorted(names)) or 'none'}, or all-linear")
    return wanted


def apply_lora(model: nn.Module, cfg: TrainConfig) -> list[str]:
    """Injects LoRA adapters into `model` in place (peft.get_peft_model) and freezes everything else.
    Returns the target names. The model object keeps its own module names (no `base_model.model.` prefix)."""
    peft = _peft()
    targets = resolve_targets(model, cfg.lora_targets)
    lc = peft.LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha or 2 * cfg.lora_rank, lora_dropout=0.0,
                         target_modules=targets, bias="none")
    peft.get_peft_model(model, lc)
    return targets


def is_adapter(param_path: str) -> bool:
    return any(m in f".{param_path}" for m in ADAPTER_MARKERS)


def keep_adapters_fp32(model: nn.Module) -> None:
    """After a model is cast to fp16/bf16: its LoRA adapters back in float32, as peft keeps them on a half base
    (get_peft_model's autocast_adapter_dtype=True); peft's forward then casts each targeted layer's input to fp32."""
    for name, p in model.named_parameters():
        if is_adapter(name) and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()
