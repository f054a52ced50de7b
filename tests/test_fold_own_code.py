"""The user's own code is traced in full by default (engine.trace.fold_known, issue 24): two probes found 84 models
of a user's own that folded wrongly past every check (benchmarks/fold_probes). By default each of those declines
and so equals its full trace; a stack of known library code (the templates', transformers') still folds; and a
user's function, hook or method on known code's stack makes it the user's own too. `fold_own_code=True` asks for
the fold anyway (the checks' tests, tests/test_fold_*.py, run that way)."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Iterator
from typing import Any

import pytest
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
from tests.test_folded_trace import _llama

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
    assert not folded and "class _Model (tests.test_fold_declines) " + OWN in why, why
    assert same
    _trace, info = trace_model(_Src(_Model), CPU)
    assert any(n.startswith("traced in") and n.endswith(", every block (the stack is the user's own code; “fold my "
                                                        "own code”, --fold-own-code, traces a few)")
               for n in info.notes), info.notes
    folded, why, same = _fold(_Src(_Model), CPU.with_(fold_own_code=True))
    assert folded and same, why


# One of each kind the probes found folding wrongly when asked to fold (benchmarks/fold_probes): a count kept by an
# iterator the loop draws from, a class attribute, a context object handed to each block, a layer-pattern string
# handed to a helper, a generator method yielding the blocks, a mutating call on a global, a shared iterator, the
# block's own class tested (the fold's index watch swaps it), a closure made per block, the block's own hooks tested.
PROBES = [loops.M_CountNextTest, loops.M_ClassAttrInLoop, loops.M_CtxArg, loops.M_PatternStrHelper,
          loops.M_GenConsumerBreak, state_1.M_Append, state_2.M_Cycle, state_4.M_TypeIs, state_7.M_CtxObj,
          state_11.M_Closure, state_14.M_OwnHooks]


@pytest.mark.parametrize("model", PROBES, ids=lambda m: m.__name__)
def test_a_probe_that_folded_wrongly_is_traced_in_full_by_default(model: type[nn.Module]):
    folded, why, same = _fold(_Src(model))
    assert not folded and OWN in why, why
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
    (_hook_on_every_block, "a hook on LlamaDecoderLayer (forward_hooks), _hook_on_every_block.<locals>.<lambda> "
                           "(from tests.test_fold_own_code) " + OWN),
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
    assert not folded and "a global module hook (global_forward_hooks)" in why and OWN in why, why
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
