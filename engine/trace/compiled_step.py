"""A step as `torch.compile(model)` runs it with the default inductor backend, traced on fake tensors.

Nothing here imitates the compiler: Dynamo captures the model's graphs, AOTAutograd's default partitioner
(min_cut_rematerialization_partition) decides what the forward saves for the backward, and inductor lowers,
fuses, schedules and writes its wrapper code for the CPU, every buffer it allocates (`empty_strided_cpu`), reuses
(`buf4 = buf0; del buf0  # reuse`) and frees (`del buf0`) included. Only the last step of a compile is left out:
the generated kernels are not built by the C compiler. The wrapper module is executed instead with its kernels as
no-ops and its allocations made on fake tensors (FakeTensorMode), so the recorder sees exactly the buffers the
compiled program allocates, when it allocates and frees them, while the fallback ops it calls (matmuls, attention,
convolutions) run as fake kernels and allocate what they allocate for real. AOTAutograd's own runtime (the
autograd.Function around the compiled forward and backward, its saved tensors) runs unchanged.

The optimizer step stays eager, as it is when only the model is compiled. A CUDA target is modelled from the CPU
plan (inductor's buffers and reuse are largely the same; its Triton kernels differ): that estimate says so.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from unittest import mock

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

from ..config.train_config import TrainConfig
from ..core.errors import Cancelled, UserError
from .recorded_step import ModelInfo, flat_tensors, recording_modes, track_gradient, track_model_state
from .recorder import RecordingMode, StorageRecorder
from .step import run_steps

CUDA_MODELLED = ("the compiled step on a CUDA target: inductor's buffer plan for the CPU (which buffers its fused "
                 "kernels allocate, reuse and free) stands for the GPU's Triton build")


class CompiledRecordingMode(RecordingMode):  # type: ignore[no-untyped-call]  # as RecordingMode
    """The recorder's dispatch mode, declared safe for torch.compile: Dynamo runs (and compiles) under it instead
    of skipping every frame as it does under other dispatch modes, so the compiled program is what it records."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class _KernelsNotBuilt:
    """Stands in for inductor's AsyncCompile while a wrapper module is loaded: each kernel (`cpp_pybinding`,
    `cpp`, …) becomes a no-op; its buffers are allocated by the wrapper itself, which runs as written."""

    def __getattr__(self, name: str) -> Callable[..., Callable[..., None]]:
        return lambda *args, **kwargs: _no_kernel

    def wait(self, scope: dict[str, Any]) -> None:
        return None


def _no_kernel(*args: Any, **kwargs: Any) -> None:
    return None


def _empty_strided_cpu(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


def _reinterpret_tensor(t: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
    return t.as_strided(size, stride, t.storage_offset() + offset)


def _no_check(*args: Any, **kwargs: Any) -> None:
    return None


# The wrapper's helpers that reach the C++ allocator (or check real strides) directly, bypassing the dispatcher:
# the same operations through it, so that fake mode makes them and the recorder sees them.
_ON_FAKE_TENSORS: dict[str, Callable[..., Any]] = {
    "empty_strided_cpu": _empty_strided_cpu,
    "reinterpret_tensor": _reinterpret_tensor,
    "assert_size_stride": _no_check,
    "assert_alignment": _no_check,
}


def _load_unbuilt(graph: Any, wrapper_code: Any) -> types.ModuleType:
    """GraphLowering._compile_to_module_lines without the C compiler: the wrapper module inductor generated,
    loaded with its kernels as no-ops and its allocations on the ambient fake mode; the graph's constants are set
    on it as inductor sets them."""
    mod = types.ModuleType("vramscope_inductor_wrapper")
    mod.__file__ = "<inductor wrapper code, kernels not built>"
    import torch._inductor.async_compile as async_compile

    with mock.patch.object(async_compile, "AsyncCompile", _KernelsNotBuilt):
        exec(compile(wrapper_code.value, mod.__file__, "exec"), mod.__dict__)  # noqa: S102 - inductor's own output
    mod.__dict__.update(_ON_FAKE_TENSORS)
    mod.__dict__.update({**graph.constants, **graph.torchbind_constants})
    return mod


class InductorOnFake:
    """torch.compile's default backend (inductor's compile_fx) with its wrapper modules loaded unbuilt; counts the
    graphs it compiles and keeps the recorder paused while it compiles (compile work is not part of the step)."""

    def __init__(self, rec: StorageRecorder) -> None:
        self.rec = rec
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        paused = self.rec.paused
        self.rec.pause()
        try:
            self.graphs += 1
            return compile_fx(gm, list(example_inputs))
        finally:
            if not paused:
                self.rec.resume("(torch.compile)")

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """While compiling and running: inductor's and AOTAutograd's caches off (a cached graph would be loaded,
        and built, without this loader), kernels compiled in this process, the wrapper loaded unbuilt."""
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config
        from torch._inductor.graph import GraphLowering

        with inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False, compile_threads=1,
                                   cpp_wrapper=False), \
                functorch_config.patch(enable_autograd_cache=False), \
                mock.patch.object(GraphLowering, "_compile_to_module_lines", _load_unbuilt):
            yield


def record_compiled_step(model: nn.Module, inputs: Any, cfg: TrainConfig, rec: StorageRecorder, info: ModelInfo,
                         fake: FakeTensorMode, probe: bool = False, micro_steps: int | None = None) -> None:
    """cfg's steps run with `torch.compile(model)` (default mode, inductor) under the recorder, on fake tensors:
    record_step's bookkeeping (parameters, inputs, gradients and optimizer state with their roles) around the
    compiled forward and backward. The optimizer step is eager. Dynamo's caches are reset afterwards (its cache
    entries hold this fake model)."""
    roles, owner = info.storage_roles, info.storage_owner
    param_owner = track_model_state(model, rec, info)
    for t in flat_tensors(inputs):
        roles.setdefault(rec.track(t, "input"), "inputs")
    params = [p for p in model.parameters() if p.requires_grad]

    def set_phase(step: int, phase: str) -> None:
        if rec.cancel is not None and rec.cancel.is_set():
            raise Cancelled()
        rec.step, rec.phase = step, phase

    def after_backward() -> None:
        for p in params:
            track_gradient(p, rec, info, param_owner)

    def after_optimizer(opt: torch.optim.Optimizer) -> None:
        for p, state in opt.state.items():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    k = rec.track(v, "optimizer_state")
                    roles[k] = "optimizer_state"
                    owner[k] = param_owner.get(id(p), "")

    # The CPU plan, for either target: no CUDA kernel choices (a function mode Dynamo would have to trace).
    recording, _kernels, _cuda = recording_modes(cfg.with_(device="cpu", gpu=None), rec, fake, probe,
                                                 mode=CompiledRecordingMode)
    _check_torch()
    backend = InductorOnFake(rec)
    import torch._dynamo

    torch._dynamo.reset()  # nothing compiled before (for another model) may be reused or count to its limits
    compiled: nn.Module = torch.compile(model, backend=backend)  # type: ignore[assignment]  # an OptimizedModule
    try:
        with backend.active(), fake, recording:
            # The compiling step, not recorded (the real measurement runs it before it starts). Compiling from
            # these fake tensors keeps the ones Dynamo converts (a graph's inputs after a graph break: GPT-2's
            # logits before its loss) alive, which compiling from real tensors does not (checked): they belong
            # to this step, untracked.
            rec.pause()
            run_steps(compiled, inputs, _compiling_step(cfg), lambda s, p: None, steps=1, micro_steps=1)
            model.zero_grad(set_to_none=True)
            rec.resume("(torch.compile's compiling step)")
            opt = run_steps(compiled, inputs, cfg, set_phase, after_backward, after_optimizer,
                            micro_steps=micro_steps)
            rec.closed = True
        del opt
    except (UserError, Cancelled, DynamicOutputShapeException, DataDependentOutputException):
        raise  # a data-dependent op: the tracer runs the (compiled) step for real instead, when it can
    except Exception as e:
        raise _compile_error(e) from None
    finally:
        torch._dynamo.reset()
    if not backend.graphs:
        raise UserError("torch.compile compiled no graph of this model (Dynamo ran all of it eagerly); its "
                        "estimate without --compile is the program that runs")
    info.notes.append(f"torch.compile (inductor, default mode): {backend.graphs} graph"
                      f"{'s' if backend.graphs != 1 else ''} compiled; buffers as inductor's generated wrapper "
                      "allocates, reuses and frees them (kernels not built); the optimizer step eager")
    if cfg.device == "cuda":
        info.modelled.append(CUDA_MODELLED)


def _check_torch() -> None:
    """The two places this module meets torch's compiler: a dispatch mode Dynamo runs under, and the step that
    loads inductor's wrapper module. A torch without them cannot be modelled (2.13 is the one checked)."""
    from torch._inductor.graph import GraphLowering
    from torch.utils._python_dispatch import TorchDispatchMode

    if not hasattr(TorchDispatchMode, "ignore_compile_internals") or \
            not hasattr(GraphLowering, "_compile_to_module_lines"):
        raise UserError(f"--compile is modelled with torch 2.13's compiler; this torch ({torch.__version__}) runs "
                        "compiled code differently: upgrade torch, or drop --compile")


def _compile_error(e: Exception) -> UserError:
    """A failure inside torch.compile as one line: Dynamo's wrapped error, first line of the cause."""
    cause: BaseException = e
    inner = getattr(e, "inner_exception", None)  # torch._dynamo.exc.BackendCompilerFailed keeps the cause
    if isinstance(inner, BaseException):
        cause = inner
    first = (str(cause).strip().splitlines() or [""])[0]
    return UserError(f"torch.compile failed on this model: {type(cause).__name__}: {first}".rstrip(": "))


def _compiling_step(cfg: TrainConfig) -> TrainConfig:
    """The step that compiles: one forward and backward (a forward in inference), no optimizer step."""
    return cfg.with_(optimizer="none", fused=False) if cfg.training else cfg


def compiled_for_real(model: nn.Module, inputs: Any, cfg: TrainConfig) -> nn.Module:
    """`torch.compile(model)` (default mode, inductor) after its compiling step (_compiling_step), its gradients
    dropped, so that the measured steps run compiled code only.
    The real counterpart of record_compiled_step (engine.measure.cpu_profiler, benchmarks/compile_zoo.py)."""
    import torch._dynamo

    torch._dynamo.reset()
    compiled: nn.Module = torch.compile(model)  # type: ignore[assignment]  # an OptimizedModule
    run_steps(compiled, inputs, _compiling_step(cfg), lambda s, p: None, steps=1, micro_steps=1)
    model.zero_grad(set_to_none=True)
    return compiled
