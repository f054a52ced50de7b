"""Text generation as a mode of the step: a prefill over the prompt, then one decode step per new token with the
model's own KV cache (transformers' DynamicCache or StaticCache), under `torch.no_grad()` — and what it reports.

Two programs: `model.generate()` (cfg.generate_program "generate", the default: engine.trace.generate_program), or the
hand-written loop below ("loop"), the one `benchmarks/gpu/measure_llm.py` measures on a GPU:
`model(input_ids=prompt, cache=cache, use_cache=True)` (`past_key_values=` before transformers 5.24), the next
token `out.logits[:, -1:].argmax(-1)`, then `new_tokens - 1` decode steps of one token each. In both, the cache
grows by one token a step and nothing else changes size but the ids, so on fake tensors only the first
`TRACED_DECODE_STEPS` decode steps and the last one are traced: before the last, the cache is grown to its final
length by its own `update` (a `torch.cat` for DynamicCache, an in-place `index_copy_` for StaticCache;
sliding-window layers keep their window), with the recorder paused, so the last step starts from exactly the
state the real program reaches. A real run (engine.measure.cpu_profiler) runs every step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from ..config.train_config import TrainConfig
from ..core.errors import UserError
from ..results.estimate_fields import GenerationFigures
from ..results.types import Trace
from . import generate_program

TRACED_DECODE_STEPS = 2  # decode steps traced before the cache is grown to its length at the last token

FastForward = generate_program.FastForward

def _hf_config(model: nn.Module, cfg: TrainConfig) -> Any:
    """The model's transformers configuration; UserError when it has none (or cannot generate())."""
    try:
        from transformers import GenerationMixin
    except ImportError:
        raise UserError("--mode generate needs the 'transformers' package: pip install transformers") from None
    config = getattr(model, "config", None)
    if config is None:
        raise UserError("--mode generate needs a Hugging Face causal language model (a config.json or a catalogue "
                        "name such as llama-3.2-1b)")
    if cfg.generate_program == "generate" and not isinstance(model, GenerationMixin):
        raise UserError(f"{type(model).__name__} has no generate(): use --generate-program loop")
    return config


def make_cache(model: nn.Module, cfg: TrainConfig, batch: int, max_len: int) -> Any:
    from transformers import DynamicCache, StaticCache

    config = _hf_config(model, cfg)
    if cfg.cache == "static":
        return StaticCache(config=config, max_cache_len=max_len)
    return DynamicCache(config=config)


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """The key and value tensors every layer of the cache holds now."""
    out = []
    for layer in getattr(cache, "layers", ()):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out


def grow_cache(cache: Any, tokens: int) -> None:
    """Every layer of `cache` takes `tokens` more positions through its own update, as decode steps would leave
    it: all but one at once, then the last alone (a sliding-window layer's storage is its window plus the token
    just added, as after a real decode step)."""
    for chunk in (tokens - 1, 1):
        if chunk <= 0:
            continue
        for layer in cache.layers:
            keys, values = layer.keys, layer.values
            k = torch.empty(keys.shape[0], keys.shape[1], chunk, keys.shape[3], dtype=keys.dtype, device=keys.device)
            v = torch.empty(values.shape[0], values.shape[1], chunk, values.shape[3], dtype=values.dtype,
                            device=values.device)
            layer.update(k, v)
            del k, v


def _cache_argument(model: nn.Module) -> str:
    """The forward's name for the cache: `cache` from transformers 5.24 (`past_key_values` is deprecated there),
    `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def decode_plan(new_tokens: int, fast: bool) -> list[int]:
    """Which decode steps run (1 = the first token after the prefill's, new_tokens - 1 = the last)."""
    last = new_tokens - 1
    if not fast or last <= TRACED_DECODE_STEPS + 1:
        return list(range(1, last + 1))
    return [*range(1, TRACED_DECODE_STEPS + 1), last]


def run_generation(
    model: nn.Module,
    inputs: Any,
    cfg: TrainConfig,
    set_phase: Callable[[int, str], None],
    on_cache: Callable[[Any], None] = lambda cache: None,
    fast_forward: FastForward | None = None,
    autocast: AbstractContextManager[Any] | None = None,
) -> Any:
    """Prefill (step 0, phase "prefill"), then decode steps (step i, phase "decode"); `on_cache(cache)` after each
    forward (the tracer gives the cache's storages their kv_cache role). With `fast_forward`, the steps between the
    first TRACED_DECODE_STEPS and the last are skipped and the cache grown instead; `autocast` is the step's
    autocast context (engine.trace.step.autocast_ctx). Returns the cache, which the
    caller releases after recording ends (the KV cache at the last token stays in the trace)."""
    if not isinstance(inputs, dict) or "input_ids" not in inputs:
        raise UserError("--mode generate needs a causal language model that takes input_ids")
    ids = inputs["input_ids"]
    batch, prompt = ids.shape
    model.eval()
    with torch.no_grad(), autocast if autocast is not None else nullcontext():
        if cfg.generate_program == "generate":
            _hf_config(model, cfg)
            if not isinstance(ids, FakeTensor):  # a real run: generate() itself, reading every value it reads
                generate_program.real_generate(model, inputs, cfg, set_phase, on_cache)
                return None
            plan = decode_plan(cfg.new_tokens, fast_forward is not None)
            return generate_program.trace_generate(model, inputs, cfg, set_phase, on_cache, plan, fast_forward,
                                                   grow_cache)
        cache = make_cache(model, cfg, batch, prompt + cfg.new_tokens)
        name = _cache_argument(model)
        set_phase(0, "prefill")
        out = model(input_ids=ids, use_cache=True, **{name: cache})
        cache = getattr(out, name)
        nxt = out.logits[:, -1:].argmax(-1)
        del out
        on_cache(cache)
        done = 0  # decode steps whose tokens are in the cache
        for step in decode_plan(cfg.new_tokens, fast_forward is not None):
            if step - 1 > done:
                set_phase(step, "decode")
                assert fast_forward is not None
                tokens = step - 1 - done

                def grow(c: Any = cache, tokens: int = tokens) -> list[torch.Tensor]:
                    grow_cache(c, tokens)
                    return []  # on_cache follows the cache's new tensors

                fast_forward(grow)
                on_cache(cache)
            set_phase(step, "decode")
            out = model(input_ids=nxt, use_cache=True, **{name: cache})
            cache = getattr(out, name)
            nxt = out.logits[:, -1:].argmax(-1)
            del out
            on_cache(cache)
            done = step
        del nxt
    return cache


def generation_figures(trace: Trace, cfg: TrainConfig) -> GenerationFigures:
    """Prefill and last-token decode peaks of a generation trace (a traced or a real one alike)."""
    running = 0
    prefill = 0
    last_step = max((e.step for e in trace.events if e.phase == "decode"), default=None)
    decode = 0
    kv = 0
    for e in trace.events:
        running += e.nbytes
        if e.category == "kv_cache":
            kv += e.nbytes
        if e.phase == "prefill":
            prefill = max(prefill, running)
        elif e.phase == "decode" and e.step == last_step:
            decode = max(decode, running)
    steps = tuple(sorted({e.step for e in trace.events if e.phase == "decode"}))
    # The prompt is the step's only input: (batch, prompt_len) int64 token ids.
    prompt = next((e.nbytes for e in trace.events if e.category == "inputs" and e.nbytes > 0), 0)
    return GenerationFigures(prompt // 8 // cfg.batch_size, cfg.new_tokens, cfg.cache, cfg.generate_program,
                             _decoding(cfg), prefill, decode, kv, steps)


def _decoding(cfg: TrainConfig) -> str:
    if not cfg.do_sample:
        return "greedy"
    parts = ["sampling"]
    if cfg.top_k is not None:
        parts.append(f"top-k {cfg.top_k}")
    if cfg.top_p is not None:
        parts.append(f"top-p {cfg.top_p:g}")
    return ", ".join(parts)


