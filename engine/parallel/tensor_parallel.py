"""Which parallel layouts a model admits. Megatron-style TP gives each rank whole attention heads (query and
key/value) and equal slices of the hidden and MLP widths: a degree that does not divide them, or a model with no
attention to split, is refused before any per-rank figure is made; so is a ZeRO/FSDP shard of less than one
parameter per rank."""

from __future__ import annotations

from torch import nn

from ..core.errors import UserError


class AttentionHeads(nn.Module):
    """Base of the templates' attention modules: `heads` query heads and `kv_heads` key/value heads."""

    heads: int
    kv_heads: int


def _attention(model: nn.Module) -> list[tuple[str, int, int]]:
    """(module name, query heads, key/value heads) of every attention module found."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, AttentionHeads):
            found.append((name, m.heads, m.kv_heads))
        elif isinstance(m, nn.MultiheadAttention):
            found.append((name, m.num_heads, m.num_heads))
    return found


def _hf_sizes(model: nn.Module) -> list[tuple[str, int]]:
    """A Hugging Face model's widths TP splits, from its config (third-party attributes, all optional)."""
    config = getattr(model, "config", None)
    out = []
    for key, label in (("num_attention_heads", "attention heads"), ("num_key_value_heads", "KV heads"),
                       ("hidden_size", "hidden size"), ("intermediate_size", "MLP width")):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            out.append((label, v))
    return out


def _divisors(n: int) -> str:
    ds = [d for d in range(1, min(n, 1024) + 1) if n % d == 0]
    return ", ".join(map(str, ds[:12]))


def check_tensor_parallel(model: nn.Module, tp: int, model_name: str) -> None:
    """UserError naming the module and the heads when `tp` cannot split `model`."""
    if tp <= 1:
        return
    where = f"--tp {tp}"
    hf = _hf_sizes(model)
    for label, v in hf:
        if v % tp:
            raise UserError(f"does not divide {model_name}'s {v} {label}; use one of {_divisors(v)}", where=where)
    attn = _attention(model)
    if not attn and not hf:
        raise UserError(f"tensor parallelism splits attention heads and their MLPs, and {model_name} has no "
                        "attention layer; use --tp 1 (and --world-size N for data parallelism)", where=where)
    for name, heads, kv in attn:
        for count, label in ((heads, "attention heads"), (kv, "KV heads")):
            if count % tp:
                raise UserError(f"does not divide the {count} {label} of '{name or model_name}'; use one of "
                                f"{_divisors(count)}", where=where)


SHARDING = ("zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid")


def check_data_parallel(trainable_parameters: int, world_size: int, tp: int, strategy: str, model_name: str) -> None:
    """UserError when a sharded strategy would leave a rank less than one parameter of the model's state."""
    if strategy not in SHARDING or world_size <= 1:
        return
    degree = world_size // tp
    if strategy == "fsdp-hybrid":
        degree = min(degree, 8)
    if trainable_parameters and degree > trainable_parameters // max(tp, 1):
        raise UserError(f"{strategy} over {degree} ranks would give each rank less than one of {model_name}'s "
                        f"{trainable_parameters:,} trainable parameters; use fewer GPUs",
                        where=f"--world-size {world_size}")
