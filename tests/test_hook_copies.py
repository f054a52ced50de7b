"""The user's callables an estimate runs (gradient hooks, module hooks, a `forward` set on an instance) run on copies of
what they hold (engine.core.callable_copy): the user's counters, lists, handles, optimizers and real modules are left
as they were, and a hook's own state gives the numbers the real run gives (the second step run, not copied, for the
user's own code: engine.trace.tracer). Each case was found by a probe of the hooks feature: before, a hook counted in
the user's program, logged fake tensors into the user's list, removed the user's own hook, stepped the user's real
optimizer (a default argument, a partial), or a `forward` override ran the user's real module."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import vramscope
from engine.core.errors import UserError
from engine.core.grad_hooks import grad_hooks
from engine.results.types import Category

sys.path.insert(0, str(Path(__file__).parent))
from test_api_step import measure_real_step  # noqa: E402 - the tests' own real-step measurement
from test_grad_hooks import _real_step  # noqa: E402 - the canonical step run for real


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512))


def _snapshot(model: nn.Module) -> list[Any]:
    return [(p.detach().clone(), p.grad, len(grad_hooks(p))) for p in model.parameters()]


def _same(a: list[Any], b: list[Any]) -> bool:
    return all(torch.equal(x[0], y[0]) and x[1] is y[1] and x[2] == y[2] for x, y in zip(a, b, strict=True))


def _counting(model: nn.Module, calls: list[int]) -> None:
    """A hook whose second step's calls allocate four times the gradient: what the step copy could not see."""

    def hook(g: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return torch.stack([g] * 4).sum(0) if calls[0] > 4 else g

    for p in model.parameters():
        p.register_hook(hook)


def test_a_hook_counting_its_calls_counts_in_the_copy_and_gives_the_real_steps_peak() -> None:
    calls = [0]
    model = _net()
    _counting(model, calls)
    before = _snapshot(model)
    x = torch.randn(64, 512)
    est = vramscope.estimate(model, x, device="cpu", optimizer="adamw")
    assert calls == [0] and _same(before, _snapshot(model))
    real_calls = [0]
    real_model = _net()
    _counting(real_model, real_calls)
    real = _real_step(real_model, x)
    assert abs(est.peak_bytes - real) / real <= 0.001, (est.peak_bytes, real)
    assert any("both steps (the model is the user's own code" in n for n in est.notes), est.notes


def test_a_logging_hook_logs_into_a_copy_of_the_users_list() -> None:
    log: list[torch.Tensor] = []
    model = _net()
    for p in model.parameters():
        p.register_hook(lambda g: log.append(g.norm()))
    vramscope.estimate(model, torch.randn(64, 512), device="cpu", optimizer="adamw")
    assert log == []  # (it held fake tensors, one per parameter and step)


def test_a_hook_removing_itself_removes_its_copy_and_leaves_the_users() -> None:
    model = _net()
    handles: list[Any] = []
    for p in model.parameters():
        def once(g: torch.Tensor, i: int = len(handles)) -> torch.Tensor:
            handles[i].remove()
            return torch.stack([g] * 4).sum(0)

        handles.append(p.register_hook(once))
    x = torch.randn(64, 512)
    est = vramscope.estimate(model, x, device="cpu", optimizer="adamw")
    assert all(len(grad_hooks(p)) == 1 for p in model.parameters())
    real_model = _net()
    real_handles: list[Any] = []
    for p in real_model.parameters():
        def real_once(g: torch.Tensor, i: int = len(real_handles)) -> torch.Tensor:
            real_handles[i].remove()
            return torch.stack([g] * 4).sum(0)

        real_handles.append(p.register_hook(real_once))
    real = _real_step(real_model, x)
    assert abs(est.peak_bytes - real) / real <= 0.001, (est.peak_bytes, real)


def _stepping_hook(form: str, model: nn.Module) -> list[torch.optim.Optimizer]:
    """An optimizer step in the backward, its optimizers reached through `form`."""
    opts = {p: torch.optim.AdamW([p]) for p in model.parameters()}

    def with_default(p: torch.Tensor, o: dict[Any, Any] = opts) -> None:
        o[p].step()
        o[p].zero_grad()

    def by_argument(o: dict[Any, Any], p: torch.Tensor) -> None:
        o[p].step()
        o[p].zero_grad()

    class Trainer:
        def __init__(self) -> None:
            self.opts = opts

        def hook(self, p: torch.Tensor) -> None:
            self.opts[p].step()
            self.opts[p].zero_grad()

    hook = {"default": with_default, "partial": functools.partial(by_argument, opts),
            "bound method": Trainer().hook}[form]
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    return list(opts.values())


@pytest.mark.parametrize("form", ["default", "partial", "bound method"])
def test_an_optimizer_step_in_the_backward_in_any_form(form: str) -> None:
    """The canonical estimate refuses it by name, with the user's gradients present (it stepped the user's real
    optimizers before); the user's own step is traced exactly and trains nothing."""
    model = _net()
    opts = _stepping_hook(form, model)
    x = torch.randn(64, 512)
    for p in model.parameters():  # the user's parameters hold gradients (set, not made: a backward runs the hooks)
        p.grad = torch.ones_like(p)
    before = _snapshot(model)
    with pytest.raises(UserError, match=r"reaches 4 optimizer\(s\) \(AdamW: an optimizer step in the backward\)"):
        vramscope.estimate(model, x, device="cpu", optimizer="adamw")
    assert _same(before, _snapshot(model)) and all(not o.state for o in opts)
    model.zero_grad(set_to_none=True)
    before = _snapshot(model)

    def step(model: nn.Module, x: torch.Tensor) -> None:
        model(x).sum().backward()

    est = vramscope.estimate_step(step, model, x, device="cpu")
    assert _same(before, _snapshot(model)) and all(not o.state for o in opts)
    assert est.step is not None and est.step.optimizers == ("4 × AdamW (held by the models' attributes or "
                                                            "gradient hooks)",)
    real = measure_real_step(step, model, x, holders=tuple(opts))
    assert abs(est.peak_bytes - real) / real <= 0.0001, (est.peak_bytes, real)


def test_optimizers_held_by_the_model_are_the_steps_own() -> None:
    """`model.opts` stepped by the hooks: their state is optimizer state, not temporaries."""
    model = _net()
    model.opts = _stepping_hook("default", model)  # type: ignore[assignment]  # (the user's attribute)
    x = torch.randn(64, 512)

    def step(model: nn.Module, x: torch.Tensor) -> None:
        model(x).sum().backward()

    est = vramscope.estimate_step(step, model, x, device="cpu")
    moments = 2 * sum(p.numel() * 4 for p in model.parameters())  # AdamW's two, and a step counter each
    assert est.breakdown_at_peak[Category.OPTIMIZER_STATE] == moments + 4 * 4


def test_a_forward_set_on_an_instance_calling_the_original_runs_on_the_copy() -> None:
    model = _net()
    original = model[2].forward
    model[2].forward = lambda h: original(h)  # type: ignore[method-assign]  # (the user's override)
    x = torch.randn(64, 512)
    est = vramscope.estimate(model, x, device="cpu", optimizer="adamw")
    assert all(p.grad is None for p in model.parameters())  # (a fake gradient on the user's own before)
    assert est.peak_bytes == vramscope.estimate(_net(), x, device="cpu", optimizer="adamw").peak_bytes


class _Trainer:
    def __init__(self, net: nn.Module) -> None:
        self.model, self.opt = net, torch.optim.AdamW(net.parameters())

    def step(self, x: torch.Tensor) -> None:
        self.model(x).sum().backward()
        self.opt.step()
        self.opt.zero_grad()


model = nn.Linear(4, 4)  # a global named as the trainer's attribute: not what the step uses


def test_a_steps_attribute_named_like_a_global_is_not_taken_for_it() -> None:
    t = _Trainer(nn.Linear(64, 64))
    est = vramscope.estimate_step(t.step, torch.randn(8, 64), device="cpu")
    assert est.peak_bytes > 0 and est.step is not None and est.step.models == ("self.model (Linear)",)


class _Counting(nn.Module):
    """A module counting its calls with a forward hook that is its own bound method."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(512, 512)
        self.calls = 0
        self.register_forward_hook(self._count)

    def _count(self, mod: nn.Module, args: Any, out: torch.Tensor) -> None:
        self.calls += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(x)


def _linear_forward(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return nn.Linear.forward(mod, x)  # type: ignore[arg-type]  # (an nn.Linear given)


def test_what_the_deep_copy_rebound_is_not_copied_again() -> None:
    """A module hook that is a bound method and a `forward` set as a partial of the module came through the model's
    deep copy already, bound to the copy: copied once more, they held a third module of their own (meta weights
    beside fake ones: the estimate failed; the user's step's hook read a stray weight)."""
    from engine.models.object_source import copy_module

    m = _Counting()
    copy = copy_module(m, meta=False)
    assert isinstance(copy, _Counting)
    copy(torch.randn(2, 512))
    assert copy.calls == 1 and m.calls == 0
    net = _net()
    x = torch.randn(64, 512)
    base = vramscope.estimate(net, x, device="cpu", optimizer="adamw").peak_bytes
    net[2].forward = functools.partial(_linear_forward, net[2])  # type: ignore[method-assign]
    assert vramscope.estimate(net, x, device="cpu", optimizer="adamw").peak_bytes == base


def test_a_model_with_accelerates_hooks_is_estimated() -> None:
    """accelerate's add_hook_to_module (what a `device_map` load puts on every module): `forward` becomes a partial of
    accelerate's function with the module, its wrapper's attributes kept."""
    accelerate_hooks = pytest.importorskip("accelerate.hooks")
    net = _net()
    x = torch.randn(64, 512)
    base = vramscope.estimate(net, x, device="cpu", optimizer="adamw").peak_bytes
    for m in net:
        accelerate_hooks.add_hook_to_module(m, accelerate_hooks.ModelHook())
    assert vramscope.estimate(net, x, device="cpu", optimizer="adamw").peak_bytes == base


def test_the_cpus_cast_in_an_in_place_op_on_two_dtypes_is_measured() -> None:
    """An in-place op's output is its input, there before the probe: its bytes are no allocation to subtract."""
    from engine.trace.cpu_kernels import probe

    f32, bf16 = torch.zeros(1024, 1024), torch.zeros(1024, 1024, dtype=torch.bfloat16)
    assert probe(torch.ops.aten.add.Tensor, (f32, bf16), {}) == (4 << 20, (4 << 20,))  # the bf16 operand cast
    assert probe(torch.ops.aten.add_.Tensor, (f32, bf16), {})[0] == 4 << 20  # (was 0)
    assert probe(torch.ops.aten.add_.Tensor, (bf16, f32), {})[0] == 8 << 20  # its fp32 self and result (was 6 MiB)


def _held_forms(model: nn.Module, form: str) -> None:
    """A forward hook on the first layer adding a tensor it holds: its own, or one of the model's parameters."""
    scale = torch.full((2048,), 0.5)
    bias = model[0].bias

    def by_closure(mod: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        return out * scale

    def by_default(mod: nn.Module, args: Any, out: torch.Tensor, s: torch.Tensor = scale) -> torch.Tensor:
        return out * s

    def by_parameter(mod: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        return out + bias

    def scaled(s: torch.Tensor, mod: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        return out * s

    hook = {"closure": by_closure, "default": by_default, "partial": functools.partial(scaled, scale),
            "model's parameter": by_parameter}[form]
    model[0].register_forward_hook(hook)


@pytest.mark.parametrize("form", ["closure", "default", "partial", "model's parameter"])
def test_a_tensor_a_hook_holds_is_the_traces_fake_one(form: str) -> None:
    """The copy's hook held the meta copy beside the fake weights (`cpu and meta!`): now the fake one."""
    model, real_model = _net(), _net()
    _held_forms(model, form)
    _held_forms(real_model, form)
    x = torch.randn(64, 512)
    est = vramscope.estimate(model, x, device="cpu", optimizer="adamw")
    real = _real_step(real_model, x)
    assert abs(est.peak_bytes - real) / real <= 0.0001, (est.peak_bytes, real)
    assert all(p.grad is None for p in model.parameters())


BIG = torch.zeros(64, 1 << 20)  # 256 MiB a hook reads a slice of


def test_a_view_of_a_tensor_a_hook_holds_is_no_allocation() -> None:
    model, real_model = _net(), _net()
    for m in (model, real_model):
        m[0].register_forward_hook(lambda mod, args, out: out + BIG[:1, :2048].sum() * 0)
    x = torch.randn(64, 512)
    est = vramscope.estimate(model, x, device="cpu", optimizer="adamw")
    real = _real_step(real_model, x)
    assert abs(est.peak_bytes - real) / real <= 0.0001, (est.peak_bytes, real)  # (+637 % with BIG counted)


def test_a_module_hook_stepping_an_optimizer_is_refused_by_the_canonical_estimate() -> None:
    model = _net()
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)

    def step_in_backward(mod: nn.Module, grad_in: Any, grad_out: Any) -> None:
        opt.step()
        opt.zero_grad()

    model[0].register_full_backward_hook(step_in_backward)
    with pytest.raises(UserError, match=r"hook .*step_in_backward reaches 1 optimizer\(s\) \(SGD"):
        vramscope.estimate(model, torch.randn(64, 512), device="cpu", optimizer="adamw")


def test_an_array_a_hook_reads_is_shared_and_a_weak_reference_points_at_the_copy() -> None:
    import numpy as np

    from engine.models.object_source import copy_module

    table = np.zeros(1 << 20)  # 8 MB of the user's data: read, not copied
    model = _net()
    ref = __import__("weakref").ref(model)
    model[0].register_forward_hook(lambda mod, args, out: out * float(table[0] + 1))
    model[2].register_forward_hook(lambda mod, args, out: out + ref()[2].bias * 0)  # type: ignore[index]
    copy = copy_module(model, meta=False)
    first, second = (next(iter(m._forward_hooks.values())) for m in (copy[0], copy[2]))
    def held(fn: Any, name: str) -> Any:
        return fn.__closure__[fn.__code__.co_freevars.index(name)].cell_contents

    assert held(first, "table") is table
    assert held(second, "ref")() is copy
    copy(torch.randn(2, 512)).sum().backward()
    assert all(p.grad is None for p in model.parameters())  # (the weak reference reached the user's model before)
