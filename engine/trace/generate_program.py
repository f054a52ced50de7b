"""`model.generate()` as a program of the generation mode: what transformers' GenerationMixin.generate, _prefill
and _sample allocate, op for op (transformers 5.24), on fake tensors; and the real call, for a real run.

On fake tensors the parts of generate() that read values cannot run: the special tokens' sanity checks, the
right-padding check, whether the attention mask is all ones (it is: the prompt is a tokenizer's unpadded output),
the stopping checks. `trace_generate` makes the tensors those reads are made on and takes the answer an unpadded
prompt generating every token gives; everything else is transformers' own code (its generation config, cache,
logits processors, stopping criteria, input preparation). A real run (`real_generate`) calls `model.generate()`
itself, with its end-of-sequence ids moved out of the vocabulary so that every token is generated, as the
estimate assumes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..config.train_config import TrainConfig

# (grow) -> None: runs `grow` out of the recorder's sight, then follows the tensors it returns
# (engine.trace.recorded_step)
FastForward = Callable[[Callable[[], Sequence[torch.Tensor]]], None]


def generate_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The arguments of the modelled `model.generate(**prompt, ...)` call."""
    kw: dict[str, Any] = {"max_new_tokens": cfg.new_tokens, "do_sample": cfg.do_sample}
    if cfg.cache == "static":
        kw["cache_implementation"] = "static"
    if cfg.do_sample:
        if cfg.top_k is not None:
            kw["top_k"] = cfg.top_k
        if cfg.top_p is not None:
            kw["top_p"] = cfg.top_p
    return kw


def real_generate(model: nn.Module, inputs: dict[str, torch.Tensor], cfg: TrainConfig,
                  set_phase: Callable[[int, str], None], on_cache: Callable[[Any], None]) -> None:
    """`model.generate()` itself; the step and phase change as each forward starts (the prefill, then decode step
    i at the i-th forward after it), `on_cache` after each forward."""
    kw = generate_kwargs(cfg)
    eos = model.generation_config.eos_token_id  # type: ignore[union-attr]
    if eos is not None:  # ids the model cannot produce: every token is generated, with the same ops as with eos
        vocab = int(model.config.get_text_config().vocab_size)  # type: ignore[union-attr, operator]
        kw["eos_token_id"] = [vocab + i for i in range(len(eos))] if isinstance(eos, list) else vocab
    calls = [0]

    def before(_m: nn.Module, _args: Any) -> None:
        if calls[0]:
            set_phase(calls[0], "decode")
        calls[0] += 1

    def after(_m: nn.Module, _args: Any, out: Any) -> None:
        on_cache(out.get("cache"))

    hooks = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    try:
        set_phase(0, "prefill")
        model.generate(**inputs, **kw)  # type: ignore[operator]
    finally:
        for h in hooks:
            h.remove()


def _read(t: torch.Tensor) -> None:
    """Where generate() reads a tensor's value (`bool()`, `.item()`): the tensor is made and dropped, its value
    taken as an unpadded prompt that generates every token has it."""


def _special_tokens(gc: Any, device: torch.device) -> None:
    """GenerationMixin._prepare_special_tokens: the token tensors, and the tensors its warnings read."""

    def tensor(token: Any) -> torch.Tensor | None:
        if token is None:
            return None
        if isinstance(token, torch.Tensor):
            return token.to(device)
        return torch.tensor(token, device=device, dtype=torch.long)

    bos, eos = tensor(gc.bos_token_id), tensor(gc.eos_token_id)
    pad, start = tensor(gc.pad_token_id), tensor(gc.decoder_start_token_id)
    if eos is not None and eos.ndim == 0:
        eos = eos.unsqueeze(0)
    if pad is None and eos is not None:
        pad = eos[0]
    if eos is not None:
        _read(torch.isin(eos, pad).any())  # type: ignore[arg-type]  # by a warning
        if not torch.is_floating_point(eos):
            _read((eos < 0).any())  # by a warning
    gc._bos_token_tensor, gc._eos_token_tensor = bos, eos
    gc._pad_token_tensor, gc._decoder_start_token_tensor = pad, start


def trace_generate(model: Any, inputs: dict[str, torch.Tensor], cfg: TrainConfig,
                   set_phase: Callable[[int, str], None], on_cache: Callable[[Any], None],
                   plan: list[int], fast_forward: FastForward | None, grow_cache: Callable[[Any, int], None]) -> Any:
    """generate() for a decoder-only model, greedy or sampling, on fake tensors; the decode steps in `plan` run,
    the cache, the ids and the position ids grown by `fast_forward` over the others. Returns the cache."""
    from transformers.generation.logits_process import LogitsProcessorList
    from transformers.generation.stopping_criteria import StoppingCriteriaList
    from transformers.utils.generic import is_flash_attention_requested

    ids = inputs["input_ids"]
    extra = {k: v for k, v in inputs.items() if k != "input_ids"}
    set_phase(0, "prefill")
    # generate(): 1. the generation config
    has_default_max_length = model.generation_config.max_length is None
    has_default_min_length = model.generation_config.min_length is None
    gc, model_kwargs = model._prepare_generation_config(None, **generate_kwargs(cfg), **extra)
    mode = gc.get_generation_mode(None)
    # 3. inputs and special tokens
    forward_args = set(inspect.signature(model.forward).parameters)
    has_mask = model_kwargs.get("attention_mask", None) is not None
    batch = ids.shape[0]
    _special_tokens(gc, ids.device)
    if gc._pad_token_tensor is not None and batch > 1:  # the right-padding check: there is none
        mask = model_kwargs.get("attention_mask", None)
        if mask is not None and mask.shape == ids.shape:
            _read(torch.any(mask[:, -1] == 0))
        else:
            _read(torch.sum(ids[:, -1] == gc._pad_token_tensor) > 0)
    # 4. attention mask and position ids
    if not has_mask and "attention_mask" in forward_args:
        model_kwargs["attention_mask"] = model._prepare_attention_mask_for_generation(ids, gc, model_kwargs)
    if model_kwargs.get("position_ids", None) is None and "position_ids" in forward_args:
        model_kwargs["position_ids"] = model._prepare_position_ids_for_generation(ids, model_kwargs)
    static = gc.cache_implementation == "static"
    if "attention_mask" in forward_args and not (is_flash_attention_requested(model.config) and static):
        _read((model_kwargs["attention_mask"] == 1).all())  # all ones: an unpadded prompt's mask is dropped
        gc._mask_length = model_kwargs["attention_mask"].shape[1]
        model_kwargs["attention_mask"] = None
    # 6. lengths; 7. the cache
    prompt = ids.shape[1]
    gc = model._prepare_generated_length(generation_config=gc, has_default_max_length=has_default_max_length,
                                         has_default_min_length=has_default_min_length, model_input_name="input_ids",
                                         inputs_tensor=ids, input_ids_length=prompt)
    if model._supports_logits_to_keep() and "logits_to_keep" not in model_kwargs:
        model_kwargs["logits_to_keep"] = 1
    model._prepare_cache_for_generation(gc, model_kwargs, mode, batch, gc.max_length - 1)
    # 8. logits processors (their encoder_input_ids check reads the prompt) and stopping criteria
    _read((ids < 0).any())
    logits_processor = model._get_logits_processor(
        generation_config=gc, input_ids_seq_length=prompt, encoder_input_ids=None, prefix_allowed_tokens_fn=None,
        logits_processor=LogitsProcessorList(), device=ids.device, model_kwargs=model_kwargs)
    stopping_criteria = model._get_stopping_criteria(generation_config=gc, stopping_criteria=StoppingCriteriaList())
    model_kwargs["use_cache"] = gc.use_cache
    # 9. _sample(**model_kwargs) takes a copy: this dict keeps the first position ids alive until generate() returns
    return _sample(model, ids, logits_processor, stopping_criteria, gc, dict(model_kwargs), set_phase, on_cache,
                   plan, fast_forward, grow_cache)


def _sample(model: Any, input_ids: torch.Tensor, logits_processor: Any, stopping_criteria: Any, gc: Any,
            model_kwargs: dict[str, Any], set_phase: Callable[[int, str], None], on_cache: Callable[[Any], None],
            plan: list[int], fast_forward: FastForward | None, grow_cache: Callable[[Any, int], None]) -> Any:
    """GenerationMixin._sample, its variables bound and rebound as there (what each keeps alive into the next
    forward matters: the fp32 copy of the last logits, the tokens, the previous step's model inputs)."""
    pad_token_id = gc._pad_token_tensor
    has_eos_stopping_criteria = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
    do_sample = gc.do_sample
    batch_size = input_ids.shape[0]
    unfinished_sequences = torch.ones(batch_size, dtype=torch.long, device=input_ids.device)
    if pad_token_id is not None:
        pad_token_id = pad_token_id.to(input_ids.device)
    prefill_consumed = False
    outputs = model._prefill(input_ids, gc, model_kwargs, is_first_iteration=True)
    cache = outputs.get("cache")
    on_cache(cache)
    done = 0  # the decode steps whose tokens are in the cache
    with model._optimize_model_for_decode():
        for step in [0, *plan]:
            if prefill_consumed:
                if step - 1 > done:
                    set_phase(step, "decode")
                    assert fast_forward is not None
                    tokens = step - 1 - done

                    def grow(tokens: int = tokens) -> list[torch.Tensor]:
                        nonlocal input_ids, model_kwargs
                        grow_cache(cache, tokens)
                        input_ids = torch.cat([input_ids, input_ids.new_zeros(batch_size, tokens)], dim=-1)
                        model_kwargs = model._update_model_kwargs_for_generation(
                            {"cache": cache}, model_kwargs, num_new_tokens=tokens)
                        return [input_ids, *(v for v in model_kwargs.values() if isinstance(v, torch.Tensor))]

                    fast_forward(grow)
                    on_cache(cache)
                model_inputs = model.prepare_inputs_for_generation(input_ids, next_sequence_length=1, **model_kwargs)
                set_phase(step, "decode")
                outputs = model(**model_inputs, return_dict=True)
                on_cache(outputs.get("cache"))
            prefill_consumed = True
            model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder=False)
            next_token_logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32, device=input_ids.device)
            next_token_scores = logits_processor(input_ids, next_token_logits)
            if do_sample:
                probs = nn.functional.softmax(next_token_scores, dim=-1)
                next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
            else:
                next_tokens = torch.argmax(next_token_scores, dim=-1)
            if has_eos_stopping_criteria:
                next_tokens = next_tokens * unfinished_sequences + pad_token_id * (1 - unfinished_sequences)
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            unfinished_sequences = unfinished_sequences & ~stopping_criteria(input_ids, None)
            _read(unfinished_sequences.max() == 0)  # StopCheck's: no sequence has finished
            del outputs
            done = step
    return cache
