"""The user's own code is traced in full by default (engine.trace.fold_known, issue 24): two probes found 84 models
of a user's own that folded wrongly past every check (benchmarks/fold_probes), and a third ten ways of putting the
user's code into a known library's model that the first version of the policy missed (below). By default each of
those declines and so equals its full trace; a stack of known library code (the templates', transformers') still
folds; and a user's function, hook or method on known code's model makes it the user's own too.
`fold_own_code=True` asks for the fold anyway (the checks' tests, tests/test_fold_*.py, run that way)."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from benchmarks.fold_identity import canonical_events
from benchmarks.fold_probes import loops, state_1, state_2, state_4, state_7, state_11, state_14
from cli.common import add_model_options, config_from_args
from engine.config.train_config import TrainConfig
from engine.models.source import ModelSource
from engine.trace.fold_plan import FoldDeclined
from engine.trace.fold_stack import cut_stack
from engine.trace.tracer import trace_model
from tests.test_fold_declines import _Model, _Src
from tests.test_folded_trace import _Fn, _llama

CPU = TrainConfig(batch_size=2, optimizer="adamw", device="cpu")
OWN = "is the user's own code: traced in full, exact (“fold my own code”, --fold-own-code"


def _fold(source: ModelSource, cfg: TrainConfig = CPU) -> tuple[bool, str, bool]:
    """(folded, the reason it did not, whether it equals the full trace event for event)."""
    folded, finfo = trace_model(source, cfg)
    full, info = trace_model(source, cfg.with_(full_trace=True))
    assert finfo.fold is not None
    same = canonical_events(folded, finfo.storage_owner) == canonical_events(full, info.storage_owner)
    return finfo.fold.folded, finfo.fold.reason, same


def test_a_users_own_model_is_traced_in_full_and_folds_when_asked():
    folded, why, same = _fold(_Src(_Model))
    assert not folded and "class _Block (tests.test_fold_declines) " + OWN in why, why
    assert same
    _trace, info = trace_model(_Src(_Model), CPU)
    assert any(n.startswith("traced in") and n.endswith(", every block and both steps (the stack is the user's own "
                                                        "code; “fold my own code”, --fold-own-code, traces a few and "
                                                        "copies the second step)")
               for n in info.notes), info.notes
    folded, why, same = _fold(_Src(_Model), CPU.with_(fold_own_code=True))
    assert folded and same, why


# One of each kind the probes found folding wrongly when asked to fold (benchmarks/fold_probes): a count kept by an
# iterator the loop draws from, a class attribute, a context object handed to each block, a layer-pattern string
# handed to a helper, a generator method yielding the blocks, a mutating call on a global, a shared iterator, the
# block's own class tested (the fold's index watch swaps it), a closure made per block, the block's own hooks tested.
PROBES = [loops.M_CountNextTest, loops.M_ClassAttrInLoop, loops.M_CtxArg, loops.M_PatternStrHelper,
          loops.M_GenConsumerBreak, state_1.M_Append, state_2.M_Cycle, state_4.M_TypeIs, state_7.M_CtxObj,
          state_14.M_OwnHooks]


@pytest.mark.parametrize("model", PROBES, ids=lambda m: m.__name__)
def test_a_probe_that_folded_wrongly_is_traced_in_full_by_default(model: type[nn.Module]):
    folded, why, same = _fold(_Src(model))
    assert not folded and OWN in why, why
    assert same


def test_a_closure_holding_its_blocks_value_makes_the_blocks_differ():
    """A probe that folded wrongly, now told apart before whose code it is: each block's `post` closes over a value
    of its block's (fold_plan._callable reads a function's closure cells, defaults and a partial's arguments)."""
    folded, why, same = _fold(_Src(state_11.M_Closure))
    assert not folded and "block 2 differs from block 1 at post" in why, why
    assert same


def test_known_code_still_folds_by_default():
    folded, why, same = _fold(_llama())
    assert folded and same, why


def _own_forward(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return type(block).forward(block, *args, **kwargs)


def _forward_on_every_block(model: nn.Module) -> None:
    for block in model.layers:
        block.forward = functools.partial(_own_forward, block)


def _hook_on_every_block(model: nn.Module) -> None:
    for block in model.layers:
        block.register_forward_hook(lambda mod, args, out: out)


@pytest.mark.parametrize("tweak, words", [
    (_forward_on_every_block, "LlamaDecoderLayer.forward (from tests.test_fold_own_code) " + OWN),
    (_hook_on_every_block, "a hook on LlamaDecoderLayer (forward_hooks) (from tests.test_fold_own_code) " + OWN),
], ids=["a-forward-of-the-users", "a-hook-of-the-users"])
def test_the_users_function_on_known_codes_blocks_makes_it_the_users_own(tweak: Any, words: str):
    folded, why, same = _fold(_llama(tweak=tweak))
    assert not folded and words in why, why
    assert same


def test_a_global_module_hook_of_the_users_makes_every_stack_the_users_own():
    handle = nn.modules.module.register_module_forward_hook(lambda mod, args, out: None)
    try:
        folded, why, same = _fold(_llama())
    finally:
        handle.remove()
    assert not folded and OWN in why, why
    assert "a global module hook (global_forward_hooks, from tests.test_fold_own_code)" in why
    assert same


def _blocks(own_code: bool) -> tuple[nn.Module, list[str]]:
    refused: list[str] = []
    cls = cut_stack(nn.ModuleList, 4, 12, refused, "blocks.", {}, [], lambda j: (j, 0), own_code)
    stack = nn.ModuleList(nn.Identity() for _ in range(12))
    stack.__class__ = cls
    return stack, refused


def _go_through(stack: nn.Module) -> Iterator[nn.Module]:
    yield from stack


def _take(stack: nn.Module, i: int) -> nn.Module:
    # (not in the test itself: pytest's rewritten asserts call locals(), which the cut stack refuses on its own)
    block: nn.Module = stack[i]
    return block


def test_the_users_function_going_through_the_cut_stack_refuses_the_fold():
    """Where the stack's classes are all known, the code that goes through it as it runs must be too."""
    stack, refused = _blocks(own_code=False)
    with pytest.raises(FoldDeclined, match="_go_through .*which goes through the stack, is the user's own code"):
        next(_go_through(stack))
    assert refused
    with pytest.raises(FoldDeclined, match="_take .*which goes through the stack, is the user's own code"):
        _take(stack, 1)
    stack, refused = _blocks(own_code=True)
    assert isinstance(_take(stack, 1), nn.Identity) and not refused


def test_the_option_is_on_the_command_line_and_in_the_config():
    p = argparse.ArgumentParser()
    add_model_options(p)
    assert config_from_args(p.parse_args(["m", "--fold-own-code"])).fold_own_code
    assert not config_from_args(p.parse_args(["m"])).fold_own_code
    assert TrainConfig.from_options({"fold_own_code": True}).fold_own_code


# -- the user's code put into a known library's model (a third probe: each folded, and wrongly, before) ------------

def _hf_llama(tweak: Any = None) -> ModelSource:
    """A tiny Hugging Face Llama (8 layers) built as transformers builds it, `tweak` applied to the model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def build(cfg: TrainConfig) -> tuple[nn.Module, Any]:
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=8, hidden_size=32, intermediate_size=64,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=128))
        if tweak is not None:
            tweak(model)
        ids = torch.randint(0, 128, (cfg.batch_size, 16))
        return model, {"input_ids": ids, "labels": ids}

    return _Fn("hf-llama-8", build)


HF = TrainConfig(batch_size=1, seq_len=16, optimizer="adamw", device="cpu")


def _silu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    return x * torch.sigmoid(x)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = self.down_proj(_silu(self.gate_proj(x)) * self.up_proj(x))
    return out


class _CallableForward:
    """A plain callable object (no __get__) set as a class's forward: called with the input only."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _silu(x)


def _patch_functional(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(torch.nn.functional, "silu", _silu)


def _patch_library_function(mp: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama

    real = modeling_llama.apply_rotary_pos_emb
    mp.setattr(modeling_llama, "apply_rotary_pos_emb", lambda *a, **k: real(*a, **k))


def _patch_tensor_method(mp: pytest.MonkeyPatch) -> None:
    real = torch.Tensor.pow
    mp.setattr(torch.Tensor, "pow", lambda self, e: real(self, e))


def _register_attention(mp: pytest.MonkeyPatch) -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mp.setitem(AttentionInterface._global_mapping, "vramscope-test", lambda *a, **k: sdpa_attention_forward(*a, **k))


def _callable_object_forward(mp: pytest.MonkeyPatch) -> None:
    from transformers import activations

    mp.setattr(activations.SiLUActivation, "forward", _CallableForward())


def _known_decorator_on_users(mp: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama

    mp.setattr(modeling_llama.LlamaMLP, "forward", torch.enable_grad()(_mlp_forward))


def _accelerate_hook(model: nn.Module) -> None:
    from accelerate.hooks import ModelHook, add_hook_to_module

    class _Hook(ModelHook):  # type: ignore[misc]
        def post_forward(self, module: nn.Module, output: Any) -> Any:
            return output

    for block in model.model.layers:
        add_hook_to_module(block.mlp, _Hook())


def _partial_holding_users(model: nn.Module) -> None:
    import operator

    for block in model.model.layers:
        block.mlp.forward = functools.partial(operator.call, _mlp_forward, block.mlp)


class _Rotary(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)


def _users_neighbour(model: nn.Module) -> None:
    model.model.rotary_emb = _Rotary(model.model.rotary_emb)


def _set_attention(model: nn.Module) -> None:
    model.config._attn_implementation = "vramscope-test"


@pytest.mark.parametrize("patch, tweak, words", [
    (_patch_functional, None, "torch.nn.functional.silu (from tests.test_fold_own_code)"),
    (_patch_library_function, None, "modeling_llama.apply_rotary_pos_emb (from tests.test_fold_own_code)"),
    (_patch_tensor_method, None, "torch.Tensor.pow (from tests.test_fold_own_code)"),
    (_register_attention, _set_attention, "(from tests.test_fold_own_code)"),
    (_callable_object_forward, None, "SiLUActivation.forward (from tests.test_fold_own_code)"),
    (_known_decorator_on_users, None, "LlamaMLP.forward (from tests.test_fold_own_code)"),
    (None, _accelerate_hook, "LlamaMLP._hf_hook (from tests.test_fold_own_code)"),
    (None, _partial_holding_users, "LlamaMLP.forward (from tests.test_fold_own_code)"),
    (None, _users_neighbour, "class _Rotary (tests.test_fold_own_code)"),
], ids=["functional-patched", "library-function-patched", "tensor-method-patched", "attention-registered",
        "callable-object-forward", "library-decorator-on-users", "accelerate-hook", "partial-holding-users",
        "a-neighbour-module"])
def test_the_users_code_inside_a_known_model_makes_it_the_users_own(monkeypatch: pytest.MonkeyPatch, patch: Any,
                                                                    tweak: Any, words: str):
    if patch is not None:
        patch(monkeypatch)
    folded, why, same = _fold(_hf_llama(tweak), HF)
    assert not folded and words in why and OWN in why, why
    assert same


def test_a_class_patched_between_two_estimates_is_read_as_patched(monkeypatch: pytest.MonkeyPatch):
    folded, why, _same = _fold(_hf_llama(), HF)
    assert folded, why
    _known_decorator_on_users(monkeypatch)
    folded, why, same = _fold(_hf_llama(), HF)
    assert not folded and OWN in why and same, why


def test_in_the_packaged_app_its_folder_holds_the_libraries(monkeypatch: pytest.MonkeyPatch, tmp_path: Any):
    """PyInstaller's bundle holds the libraries and Python's own modules in its folder, not in site-packages: read
    as installed there, or every library model would be the user's own in the packaged app."""
    import importlib

    from engine.core import code_origin

    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    try:
        bundled = importlib.reload(code_origin)
        assert str(tmp_path.resolve()) in bundled._SITE and str(tmp_path.resolve()) in bundled._STDLIB
        assert bundled.installed("pyimod02_importers")  # (the loader every bundled module's __loader__ is)
    finally:
        monkeypatch.undo()
        importlib.reload(code_origin)
    assert str(tmp_path.resolve()) not in code_origin._SITE and not code_origin.installed("pyimod02_importers")
    assert code_origin.installed("tqdm") and code_origin.known_module("engine.trace") and \
        code_origin.known_module("functools") and not code_origin.installed("tests.test_fold_own_code")
