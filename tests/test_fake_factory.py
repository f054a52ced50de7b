"""The parameters and buffers the tracer and the planner fake (engine.trace.fake_factory) are the tensors fake mode's
own factory call and nn.Parameter make, attribute for attribute."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from engine.trace.fake_factory import fake_empty, fake_parameter

LIKES = [
    torch.empty(4096, 11008, device="meta"),
    torch.empty(3, 5, device="meta").t(),  # strides not contiguous
    torch.empty(8, 3, 7, 7, device="meta").to(memory_format=torch.channels_last),
    torch.empty((), device="meta"),
    torch.empty(0, 4, device="meta"),
]


def _described(t: torch.Tensor, fm: FakeTensorMode) -> tuple[object, ...]:
    return (type(t), tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad, t.is_leaf, t.grad_fn,
            isinstance(t, nn.Parameter), t.storage_offset(), t._is_view(), t.untyped_storage().nbytes(),
            isinstance(t, FakeTensor) and t.fake_mode is fm)


@pytest.mark.parametrize("like", LIKES, ids=lambda t: f"{tuple(t.shape)}:{t.stride()}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_an_empty_fake_tensor_is_the_factory_calls(like: torch.Tensor, dtype: torch.dtype) -> None:
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    with fm:
        want = torch.empty_strided(like.size(), like.stride(), device="cpu", dtype=dtype)
    assert _described(fake_empty(fm, like, dtype), fm) == _described(want, fm)


@pytest.mark.parametrize("like", LIKES, ids=lambda t: f"{tuple(t.shape)}:{t.stride()}")
@pytest.mark.parametrize("requires_grad", [True, False])
def test_a_fake_parameter_is_nn_parameters(like: torch.Tensor, requires_grad: bool) -> None:
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    with fm:
        want = nn.Parameter(torch.empty_strided(like.size(), like.stride(), device="cpu"), requires_grad=requires_grad)
    got = fake_parameter(fm, like, torch.float32, requires_grad)
    assert _described(got, fm) == _described(want, fm)
    assert got._is_param  # type: ignore[attr-defined]  # nn.Parameter's mark on a tensor subclass


def test_a_fake_parameter_trains_as_one() -> None:
    """An optimizer and autograd take it as they take nn.Parameter's: a leaf whose gradient accumulates."""
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    w = fake_parameter(fm, torch.empty(4, 3, device="meta"), torch.float32, True)
    with fm:
        x = torch.empty(2, 4)
        (x @ w).sum().backward()
        assert w.grad is not None and w.grad.shape == w.shape
        opt = torch.optim.SGD([w], lr=0.1)
        opt.step()
