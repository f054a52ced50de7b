"""The fields of a Hugging Face config.json the engine relies on, checked before transformers sees them: a size
that is not a whole number above 0, heads that do not divide the width, more layers than any model has. Each
is one line naming the field (transformers, huggingface_hub and torch raised tracebacks, or ran for minutes)."""

from __future__ import annotations

from typing import Any

from ..core.errors import UserError, printable
from ..core.limits import MAX_FIELD

MAX_LAYERS = 1024  # the deepest published models have ~130 layers; beyond this a trace would take minutes
# sizes and counts (None is allowed: transformers then takes its default, e.g. GPT-2's n_inner)
SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
         "num_key_value_heads", "max_position_embeddings", "head_dim", "n_embd", "n_head", "n_layer", "n_positions",
         "n_inner", "n_ctx", "d_model", "d_ff", "num_layers", "num_heads", "encoder_layers", "decoder_layers",
         "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
         "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "image_size",
         "patch_size", "num_channels", "max_source_positions", "max_target_positions", "num_mel_bins")
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers")
# (width, heads) pairs whose heads must divide the width when the config gives no head_dim of its own
WIDTH_HEADS = (("hidden_size", "num_attention_heads"), ("n_embd", "n_head"), ("d_model", "encoder_attention_heads"),
               ("d_model", "decoder_attention_heads"))


def check_hf_fields(data: dict[str, Any], where: str) -> None:
    """UserError (one line naming `where` and the field) for a field the engine cannot build a model from."""
    _check(data, where, "")
    for sub in ("text_config", "vision_config", "encoder", "decoder"):
        nested = data.get(sub)
        if isinstance(nested, dict):
            _check(nested, where, f"{sub}.")


def _check(d: dict[str, Any], where: str, prefix: str) -> None:
    for key in SIZES:
        v = d.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_FIELD:
            raise UserError(f"'{where}': \"{prefix}{key}\" is {printable(v, 30)}; it must be a whole number above 0 "
                            f"(at most {MAX_FIELD:,})")
    for key in LAYERS:
        v = d.get(key)
        if isinstance(v, int) and v > MAX_LAYERS:
            raise UserError(f"'{where}': \"{prefix}{key}\" is {v:,}; VRAMScope models at most {MAX_LAYERS:,} layers "
                            "(the deepest published models have about 130)")
    if d.get("head_dim") is None:
        for width, heads in WIDTH_HEADS:
            w, h = d.get(width), d.get(heads)
            if isinstance(w, int) and isinstance(h, int) and w % h:
                raise UserError(f"'{where}': \"{prefix}{heads}\" ({h}) does not divide \"{prefix}{width}\" ({w}); "
                                "each attention head takes an equal share of the width")
    n_heads, kv = d.get("num_attention_heads"), d.get("num_key_value_heads")
    if isinstance(n_heads, int) and isinstance(kv, int) and n_heads % kv:
        raise UserError(f"'{where}': \"{prefix}num_key_value_heads\" ({kv}) does not divide "
                        f"\"{prefix}num_attention_heads\" ({n_heads}); each KV head serves a whole group of heads")
    experts, per_token = d.get("num_local_experts") or d.get("num_experts"), d.get("num_experts_per_tok")
    if isinstance(experts, int) and isinstance(per_token, int) and per_token > experts:
        raise UserError(f"'{where}': \"{prefix}num_experts_per_tok\" ({per_token}) is more than the {experts} "
                        "experts there are")
