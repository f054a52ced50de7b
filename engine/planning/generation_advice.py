"""Generation's own levers for the planner: the longest prompt that fits the target, fewer new tokens, a static
KV cache, quantized weights and tensor parallelism — each re-traced (tensor parallelism: re-sharded from the traced
step), with the bytes it saves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..config.train_config import TrainConfig
from ..core.errors import UserError
from ..models.source import ModelSource
from ..parallel.sharding import sharded_estimate
from ..parallel.tensor_parallel import check_tensor_parallel
from ..results.types import Estimate


class Offer(Protocol):
    """The planner's way to add one change: its estimate becomes a Recommendation when it saves bytes."""

    def __call__(self, title: str, detail: str, cost: str, new_cfg: TrainConfig, est: Estimate) -> None: ...


def _prompt_of(base: Estimate, cfg: TrainConfig) -> int | None:
    """The prompt the step was traced with (the configuration may leave it to the model's default)."""
    gen = base.generation
    return cfg.prompt_len or (gen.prompt_len if gen is not None and gen.prompt_len else None)


def generation_levers(source: ModelSource, cfg: TrainConfig, base: Estimate,
                      run: Callable[[TrainConfig], Estimate], offer: Offer,
                      longest_prompt: Callable[[], int | None]) -> None:
    """Offer each lever that lowers a generation step's peak (`run` traces a configuration, `offer` keeps it,
    `longest_prompt()` is the longest prompt whose nvidia-smi figure fits the target: the planner's max-context
    search, None when not even one token fits); an inference pass gets the two that are not generation's own
    (quantized weights, tensor parallelism)."""
    spec = cfg.gpu_spec
    smi = base.gpu.nvidia_smi_bytes if base.gpu is not None else None
    too_big = spec is not None and smi is not None and smi > spec.usable_bytes
    prompt = _prompt_of(base, cfg) if cfg.generating else None
    if prompt and prompt >= 2:
        longest = longest_prompt() if too_big else None
        if longest is not None and longest < prompt:
            c = cfg.with_(prompt_len=longest)
            offer(f"Shorter prompt ({prompt:,} → {longest:,} tokens, the longest that fits)",
                  f"--prompt-len {longest}: the longest prompt whose step fits the {spec.name if spec else 'GPU'} "
                  f"with {cfg.new_tokens:,} new tokens (the prefill's activations and the KV cache scale with it)",
                  "less context: the prompt must be cut or summarised", c, run(c))
        else:
            c = cfg.with_(prompt_len=prompt // 2)
            offer(f"Shorter prompt ({prompt:,} → {prompt // 2:,} tokens)",
                  f"--prompt-len {prompt // 2}: the prefill's activations and the KV cache scale with the prompt",
                  "less context: the prompt must be cut or summarised", c, run(c))
    if cfg.generating and cfg.new_tokens >= 2:
        c = cfg.with_(new_tokens=cfg.new_tokens // 2)
        offer(f"Fewer new tokens ({cfg.new_tokens:,} → {cfg.new_tokens // 2:,})",
              f"--new-tokens {cfg.new_tokens // 2}: the KV cache holds the prompt and every token generated",
              "shorter answers", c, run(c))
    if cfg.generating and cfg.cache == "dynamic":
        c = cfg.with_(cache="static")
        offer("Static KV cache", "--cache static: transformers' StaticCache, allocated once at its full length "
              "(the dynamic cache grows by concatenation, holding old and new copies at once)",
              "the cache takes its full length from the first token", c, run(c))
    if cfg.weight_format is None:
        for fmt, what, cost in (
            ("int8", "bitsandbytes LLM.int8(): the Linear weights in 8 bits",
             "needs bitsandbytes; slower matmuls; a small quality risk"),
            ("nf4", "bitsandbytes 4-bit NF4: the Linear weights in 4 bits with double quantization",
             "needs bitsandbytes; dequantized per layer (slower); a quality risk from 4 bits"),
        ):
            c = cfg.with_(weights=fmt)
            offer(f"Quantized weights ({fmt})", f"--weights {fmt}: {what}", cost, c, run(c))
    if cfg.tp == 1 and cfg.world_size == 1:
        from ..trace.meta_build import build_on_meta

        model, _inputs = build_on_meta(source, cfg.with_(batch_size=1))
        chosen: tuple[TrainConfig, Estimate] | None = None  # the fewest GPUs that fit, else the most that split
        for n in (2, 4, 8):
            c = cfg.with_(world_size=n, tp=n)
            try:
                check_tensor_parallel(model, n, base.model_name)
                chosen = (c, sharded_estimate(base, c))
            except UserError:
                break  # the model's heads do not split n ways (nor, then, 2n ways)
            sh = chosen[1]
            if spec is None or (sh.gpu is not None and sh.gpu.nvidia_smi_bytes <= spec.usable_bytes):
                break
        if chosen is not None:
            c, sh = chosen
            kv = " and KV cache" if cfg.generating else ""
            offer(f"Tensor parallelism across {c.tp} GPUs", f"--tp {c.tp} --world-size {c.tp}: each GPU holds "
                  f"1/{c.tp} of the attention heads and MLP columns, their weights{kv} (per-GPU figure from the "
                  "traced step)", f"{c.tp} GPUs; an all-reduce per layer (fast links: NVLink)", c, sh)
