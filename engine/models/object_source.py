"""A model the user already holds as a Python object (the Python API, `vramscope.estimate(model, inputs)`): one more
model source. The user's model and inputs are never changed: each build is a copy, on the meta device for the
tracer, with the values for a real run on the CPU (the profiler)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..config.train_config import TrainConfig
from ..core.callable_copy import copy_model_callables, map_hook_dicts
from ..core.errors import UserError
from ..core.grad_hooks import carry_grad_hooks
from ..core.hook_reach import check_no_optimizer_in_hooks, hooks_reach
from ..core.tensor_tree import map_tensors
from .source import ModelSource


def _under_meta() -> bool:
    """Is a `with torch.device("meta"):` in force (the tracer builds its models there)?"""
    return torch.empty(0).device.type == "meta"


def _copy_tensor(t: torch.Tensor, meta: bool) -> torch.Tensor:
    if meta or t.device.type == "meta":  # a meta tensor run for real: empty CPU memory of its size
        new = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta" if meta else "cpu")
    else:
        new = t.detach().to("cpu", copy=True)
    if isinstance(t, nn.Parameter):  # (its gradient hooks run in the real step: engine.core.grad_hooks)
        return carry_grad_hooks(t, nn.Parameter(new, requires_grad=t.requires_grad))
    return new


def copy_module(model: nn.Module, meta: bool) -> nn.Module:
    """`model` deep-copied with its parameters and buffers on the meta device (`meta`) or as CPU copies of their
    values, its callables copied with it (engine.core.callable_copy); tied weights stay tied. Raises UserError naming
    what could not be copied."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in memo:
            memo[id(t)] = _copy_tensor(t, meta)
            map_hook_dicts(t, memo[id(t)], memo)
    for t in hooks_reach(model).tensors:  # what its callables hold (a state, a global tensor): copied as the weights
        if id(t) not in memo:
            memo[id(t)] = _copy_tensor(t, meta)
    try:
        copied = copy.deepcopy(model, memo)
    except Exception as e:  # noqa: BLE001 - the user's object: any failure to copy it is one line
        first = (str(e).strip().splitlines() or [""])[0]
        raise UserError(f"the model ({type(model).__name__}) cannot be copied with copy.deepcopy, which the estimate "
                        f"needs to leave it unchanged: {type(e).__name__}: {first}") from None
    # its hooks and instance functions reach the copy, not the user's objects (a counter, a log, the real module)
    copy_model_callables(copied, memo, {})
    return copied


def copy_inputs(inputs: Any, meta: bool) -> Any:
    """The inputs' tensors copied as `copy_module` copies weights; one tensor given twice stays one."""
    seen: dict[int, torch.Tensor] = {}

    def conv(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in seen:
            seen[id(t)] = _copy_tensor(t, meta)
        return seen[id(t)]

    return map_tensors(inputs, conv)


def check_inputs(inputs: object, what: str = "inputs") -> Any:
    """The inputs as the step calls the model with them (a tensor, a tuple of arguments, a dict of keywords);
    UserError for anything else, or for inputs holding no tensor."""
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(inputs, (torch.Tensor, tuple, dict)):
        raise UserError(f"{what} must be a tensor, a tuple or list of arguments, or a dict of keyword arguments; "
                        f"got {type(inputs).__name__}")
    if first_tensor(inputs) is None:
        raise UserError(f"{what} hold no tensor: give the example batch the model is called with")
    return inputs


def first_tensor(inputs: object) -> torch.Tensor | None:
    found: list[torch.Tensor] = []
    map_tensors(inputs, found.append)
    return found[0] if found else None


def batch_of(inputs: object) -> int:
    """The batch size the inputs imply: the first dimension of their first tensor (1 for a 0-d one)."""
    t = first_tensor(inputs)
    return int(t.size(0)) if t is not None and t.dim() >= 1 and t.size(0) > 0 else 1


class ObjectSource(ModelSource):
    """`(model, inputs)` the user holds: a real model, one built on the meta device, or under `vramscope.fake()`."""

    kind = "object"

    def __init__(self, model: nn.Module, inputs: Any, name: str | None = None):
        if not isinstance(model, nn.Module):
            raise UserError(f"model must be a torch.nn.Module; got {type(model).__name__}")
        self.model = model
        self.inputs = check_inputs(inputs)
        self.name = name or type(model).__name__

    def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
        if cfg.training:  # (refused before anything is copied: a hook's optimizers hold a state as large as the model)
            check_no_optimizer_in_hooks(self.model)
        meta = _under_meta()
        return copy_module(self.model, meta), copy_inputs(self.inputs, meta)

    def describe(self) -> str:
        return f"the {type(self.model).__name__} object given to vramscope.estimate"
