"""A parameter's gradient hooks (`Tensor.register_hook`, `register_post_accumulate_grad_hook`): what a real backward
runs on its gradient (a clipping hook's new gradient, a post-accumulate hook's noise or per-parameter update).

The engine makes its own copy of every parameter it traces or measures (on meta, fake, a CPU copy of the user's
model); each copy takes the hooks along, so the traced step runs what the real step runs. A copy without them
left out what they allocate: a model whose `__init__` registered `p.register_hook(lambda g: torch.stack([g] * 4)
.sum(0))` was estimated 23 % under its real CPU step (tests/test_grad_hooks.py)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

# the tensor attributes holding them (torch's; each None until a hook of its kind is registered)
HOOK_DICTS = ("_backward_hooks", "_post_accumulate_grad_hooks")


def has_grad_hooks(t: torch.Tensor) -> bool:
    """Has `t` a gradient hook of either kind (grad_hooks(t) not empty, without making the list)?"""
    return bool(t._backward_hooks or t._post_accumulate_grad_hooks)


def grad_hooks(t: torch.Tensor) -> list[Callable[..., Any]]:
    """The gradient hooks registered on `t`, both kinds, in the order they were registered (each kind's)."""
    pre = t._backward_hooks or {}
    post = t._post_accumulate_grad_hooks or {}
    return [*pre.values(), *post.values()]


def carry_grad_hooks(src: torch.Tensor, dst: torch.Tensor, share: bool = False) -> torch.Tensor:
    """`dst` (a new leaf standing for the parameter `src`) given `src`'s gradient hooks; returned. Assigning the
    dicts installs them (torch's setters register them with autograd). A copy of the user's parameter gets copies
    (a hook removed from the copy stays on the user's: engine.core.callable_copy.map_hook_dicts points the user's
    handles at the copies); `share`: the same dicts, for a tensor replacing `src` (the trace's fake parameter for the
    meta one it built: a handle removes the hook from both)."""
    pre, post = src._backward_hooks, src._post_accumulate_grad_hooks
    if pre:
        dst._backward_hooks = pre if share else OrderedDict(pre)
    if post:
        dst._post_accumulate_grad_hooks = post if share else OrderedDict(post)
    return dst
