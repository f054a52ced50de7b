"""Calibrating a CUDA GPU: measure what its context, libraries and kernels take, and keep it as a profile.

On a machine with an NVIDIA GPU, `calibrate` runs real training steps (a small convolution + GEMM probe that loads
cuDNN and cuBLAS on both the forward and the autograd thread, then the user's model if one is given) with every aten
op watched: memory allocated before and after it and the peak inside it (the same records as
../shared/gpu/record_ops.py), and, for each kernel op, every request it made of the caching allocator in order
(engine.cuda.kernel_requests: the allocator's own trace, recorded while the steps run). engine.cuda.gpu_profile learns
the profile from those records; the CUDA context is NVML's used memory for this process minus what the caching allocator
reserved. The profile is merged into the one already kept for that GPU model, so calibrating several models adds up.

Running one traced kernel call for real on the local GPU is engine.cuda.kernel_probe's (the recorder uses it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ..config.gpus import find_gpu
from ..config.train_config import TrainConfig
from ..core.errors import UserError
from ..core.tensor_tree import map_tensors
from ..cuda.device_model import measure_context_bytes
from ..cuda.gpu_profile import KERNEL_OPS, GpuProfile, KernelRecord, profile_for, profile_from_ops, short_op
from ..cuda.kernel_requests import OpSpan, TraceRecording, attach_requests, counters
from ..trace.step import DTYPES, cast_inputs, run_steps

NO_GPU = ("no CUDA GPU on this machine (torch.cuda.is_available() is False): calibrate on a machine with the GPU, "
          "then `vramscope calibrate --import FILE` here")


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install is "no GPU" here
        return False


def _op_recorder(rows: list[dict[str, Any]], spans: list[tuple[int, OpSpan]] | None = None,
                 device: int = 0) -> Any:
    """A dispatch mode appending one record per op to `rows`; with `spans`, each kernel op's (row, OpSpan): the
    allocator's counters around it, to find its requests in the allocator's trace (engine.cuda.kernel_requests)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class OpMemory(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            kernel = spans is not None and short_op(str(func)) in KERNEL_OPS
            if kernel:
                a0, f0 = counters(device)
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = func(*args, **kwargs)
            peak, after = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
            if kernel and spans is not None:
                a1, f1 = counters(device)
                spans.append((len(rows), OpSpan(a0, a1, f0, f1)))
            seen: dict[int, int] = {}
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                    st = t.untyped_storage()
                    seen[st.data_ptr()] = st.nbytes()
            ins = [[list(t.shape), str(t.dtype).replace("torch.", "")]
                   for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            rows.append({"op": str(func), "in": ins, "out": sum(seen.values()), "before": before, "after": after,
                         "peak": peak})
            return out

    return OpMemory()  # type: ignore[no-untyped-call]


def _probe_model(batch_size: int) -> tuple[Any, Any]:
    """A small network whose training step loads what most models load: cuDNN convolution, batch norm, cuBLAS."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
    return model, torch.randn(batch_size, 3, 64, 64)


def record_steps(model: Any, inputs: Any, cfg: TrainConfig, device: str) -> list[dict[str, Any]]:
    """The op records of cfg's two steps of `model`, run for real on `device`; each kernel op's record has its
    allocator requests in order (`"requests"`) where this PyTorch can record the allocator's trace."""
    import torch

    if cfg.precision in ("fp16", "bf16"):
        model.to(DTYPES[cfg.precision])
        inputs = cast_inputs(inputs, DTYPES[cfg.precision])
    model.to(device)
    inputs = map_tensors(inputs, lambda t: t.to(device))
    torch.cuda.synchronize()
    rows: list[dict[str, Any]] = []
    spans: list[tuple[int, OpSpan]] = []
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    with TraceRecording(index) as trace:
        with _op_recorder(rows, spans if trace.available else None, index):
            run_steps(model, inputs, cfg, lambda s, p: None)  # AMP: the forward autocast on CUDA, as users run it
        torch.cuda.synchronize()
        attach_requests(rows, spans, trace.taken())
    return rows


def calibrate(
    gpu_index: int = 0,
    source: Any = None,
    cfg: TrainConfig | None = None,
    *,
    progress: Callable[[float, str], None] | None = None,
) -> GpuProfile:
    """Measure this machine's GPU `gpu_index` (and `source`'s kernels under `cfg`, when given): a merged profile."""
    if not cuda_available():
        raise UserError(NO_GPU, where="calibrate")
    if cfg is not None and cfg.compile:
        raise UserError("calibrates the eager kernels a model runs; drop --compile", where="calibrate")
    import torch

    if gpu_index < 0 or gpu_index >= torch.cuda.device_count():
        raise UserError(f"GPU index {gpu_index} does not exist: this machine has {torch.cuda.device_count()} "
                        f"(0 to {torch.cuda.device_count() - 1})", where="--gpu-index")
    torch.cuda.set_device(gpu_index)
    device = f"cuda:{gpu_index}"
    name = torch.cuda.get_device_name(gpu_index)
    try:
        name = find_gpu(name).name
    except UserError:
        pass  # a GPU the catalogue does not know keeps its own name
    cc = tuple(torch.cuda.get_device_capability(gpu_index))
    rows: list[dict[str, Any]] = []

    def head(case: str, config: dict[str, Any]) -> dict[str, Any]:
        return {"case": case, "config": config, "gpu": name, "torch": torch.__version__,
                "cudnn": torch.backends.cudnn.version()}  # type: ignore[no-untyped-call]

    if progress:
        progress(0.1, "probe step (cuDNN, cuBLAS)")
    probe_cfg = TrainConfig(batch_size=8, optimizer="adam", device="cuda")
    model, inputs = _probe_model(8)
    rows.append(head("calibration-probe", {"batch_size": 8, "optimizer": "adam"}))
    rows += record_steps(model, inputs, probe_cfg, device)
    del model, inputs
    context = measure_context_bytes(init=True)
    cases = 1
    if source is not None:
        cfg = (cfg or TrainConfig()).with_(device="cuda")
        if progress:
            progress(0.4, f"measuring {source.name}'s kernels")
        model, inputs = source.build(cfg)
        rows.append(head(source.name, {k: v for k, v in cfg.to_json().items() if v != TrainConfig().to_json()[k]}))
        t0 = time.perf_counter()
        rows += record_steps(model, inputs, cfg, device)
        del model, inputs
        cases += 1
        if progress:
            progress(0.9, f"measured in {time.perf_counter() - t0:.1f} s")
        context = measure_context_bytes() or context
    torch.cuda.empty_cache()
    learned = profile_from_ops(
        rows, gpu_name=name, compute_capability=(int(cc[0]), int(cc[1])), context_bytes=context,
        source=f"vramscope calibrate on this machine's GPU {gpu_index} ({name}), {time.strftime('%Y-%m-%d %H:%M')}",
    )
    return merge(profile_for(name), learned)


def merge(old: GpuProfile | None, new: GpuProfile) -> GpuProfile:
    """`new` with what `old` (the same GPU model, the same cuDNN major) had measured and `new` did not."""
    if old is None or tuple(old.compute_capability) != tuple(new.compute_capability) \
            or old.cudnn_major != new.cudnn_major:
        return new
    table: dict[tuple[Any, ...], KernelRecord] = {k.key: k for k in old.kernels}
    for k in new.kernels:
        prev = table.get(k.key)
        table[k.key] = k if prev is None else KernelRecord(
            k.op, k.inputs, k.out, max(k.scratch, prev.scratch), min(k.scratch_min, prev.scratch_min),
            k.count + prev.count, k.requests or prev.requests)
    cases = tuple(dict.fromkeys(old.cases + new.cases))
    return GpuProfile(
        gpu_name=new.gpu_name, compute_capability=new.compute_capability, cuda=new.cuda, cudnn=new.cudnn,
        torch=new.torch, context_bytes=new.context_bytes or old.context_bytes,
        cublas_workspaces=new.cublas_workspaces or old.cublas_workspaces, kernels=tuple(table.values()),
        source=new.source, cases=cases, context_inference_bytes=old.context_inference_bytes,
    )


def describe(p: GpuProfile) -> dict[str, Any]:
    """A JSON-able summary for `calibrate --json`."""
    out: dict[str, Any] = json.loads(json.dumps({
        "gpu": p.gpu_name, "compute_capability": list(p.compute_capability), "cuda": p.cuda, "cudnn": p.cudnn,
        "torch": p.torch, "context_bytes": p.context_bytes, "cublas_workspaces": list(p.cublas_workspaces),
        "kernel_shapes": len(p.kernels), "cases": list(p.cases), "path": p.path,
    }))
    return out
