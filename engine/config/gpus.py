"""The GPU catalogue (resources/gpus.json) and the CUDA context / library workspace table (resources/cuda_context.json).

`find_gpu` resolves what a user types ('h100', 'RTX 4090', 'A100-SXM4-80GB') to one catalogue entry; TrainConfig
calls it once, when a configuration is built, and every view reads `cfg.gpu_spec`. `local_gpu` is this machine's GPU
(asked of NVML once: the default target); `is_this_machines_gpu` says whether a target is the card torch computes on
here (its CUDA device), so that what is measured here counts for it.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..core import nvml
from ..core.errors import UserError
from ..core.resources import resources_root

RESOURCES = resources_root()
MIB = 1024**2


@dataclass(frozen=True)
class GpuSpec:
    name: str
    aliases: tuple[str, ...]
    memory_bytes: int  # nvidia-smi "Total"
    usable_bytes: int  # what a process can allocate: measured total_memory, else Total minus an estimate
    usable_measured: bool
    compute_capability: tuple[int, int]
    architecture: str  # "ampere", "hopper", …: resources/gpus.json's architectures, by the compute capability
    memory_type: str
    sm_count: int  # streaming multiprocessors (NVIDIA's published figure): the CUDA reduction model sizes by it

    @property
    def cc(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


def _load(name: str) -> dict[str, Any]:
    with open(RESOURCES / name, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


@lru_cache(maxsize=1)
def _context_table() -> dict[str, Any]:
    return _load("cuda_context.json")


@lru_cache(maxsize=1)
def list_gpus() -> tuple[GpuSpec, ...]:
    data = _load("gpus.json")
    reserve = _context_table().get("driver_reserved_fraction", 0.008)
    out = []
    for g in data["gpus"]:
        total = int(g["memory_mib"]) * MIB
        usable = g.get("usable_mib")
        major, minor = (int(x) for x in g["cc"].split("."))
        out.append(
            GpuSpec(
                name=g["name"],
                aliases=tuple(g.get("aliases", ())),
                memory_bytes=total,
                usable_bytes=int(usable) * MIB if usable else int(total * (1 - reserve)) // MIB * MIB,
                usable_measured=bool(usable),
                compute_capability=(major, minor),
                architecture=architecture_of((major, minor)),
                memory_type=g.get("memory_type", ""),
                sm_count=int(g["sm_count"]),
            )
        )
    return tuple(out)


def _norm(s: str) -> str:
    s = s.lower().replace("nvidia", "").replace("geforce", "").replace("tesla", "")
    return re.sub(r"[^a-z0-9]", "", s)


@lru_cache(maxsize=64)
def find_gpu(name: str) -> GpuSpec:
    """Case-insensitive, punctuation-insensitive lookup by name or alias; a unique prefix/substring also matches.

    UserError (with close names) when nothing or more than one GPU matches.
    """
    if not name or not str(name).strip():
        raise UserError("no GPU named; try one of: " + ", ".join(g.name for g in list_gpus()), where="--gpu")
    key = _norm(str(name))
    gpus = list_gpus()
    names: dict[str, GpuSpec] = {}
    for g in gpus:
        for n in (g.name, *g.aliases):
            names.setdefault(_norm(n), g)
    if key in names:
        return names[key]
    # a unique substring ("h200" in "h200141gb"), or a name whose digits and letters all appear ("a10080")
    hits = {g.name: g for n, g in names.items() if key and key in n}
    if len(hits) == 1:
        return next(iter(hits.values()))
    if len(hits) > 1:
        raise UserError(f"'{name}' matches several GPUs: {', '.join(sorted(hits))}; name one", where="--gpu")
    close = difflib.get_close_matches(key, list(names), n=3, cutoff=0.5)
    suggestions = []
    for c in close:
        if names[c].name not in suggestions:
            suggestions.append(names[c].name)
    hint = f" (did you mean {', '.join(repr(s) for s in suggestions)}?)" if suggestions else ""
    raise UserError(
        f"unknown GPU '{name}'{hint}; the catalogue has: {', '.join(g.name for g in gpus)}", where="--gpu"
    )


# ----------------------------------------------------------------------------------------- context and workspaces


def _cuda_row(cuda_version: str | None) -> str:
    """cuda13 (also newer), cuda12, cuda11_lazy (11.7+), cuda11_eager (older, kernels loaded eagerly)."""
    if not cuda_version:
        return "cuda12"
    try:
        parts = [int(p) for p in str(cuda_version).split(".")[:2]]
    except ValueError:
        return "cuda12"
    major, minor = parts[0], parts[1] if len(parts) > 1 else 0
    if major >= 13:
        return "cuda13"
    if major >= 12:
        return "cuda12"
    if major == 11 and minor >= 7:
        return "cuda11_lazy"
    return "cuda11_eager"


@lru_cache(maxsize=1)
def architectures() -> tuple[tuple[tuple[int, int], str], ...]:
    """(first compute capability, architecture) of each NVIDIA architecture, oldest first (resources/gpus.json)."""
    table = _load("gpus.json")["architectures"]
    firsts = []
    for name, cc in table.items():
        if name != "about":
            major, minor = (int(x) for x in str(cc).split("."))
            firsts.append(((major, minor), name))
    return tuple(sorted(firsts))


def architecture_of(cc: tuple[int, int]) -> str:
    """The architecture of a compute capability: the last whose first compute capability is not above it (older
    than the table: its oldest)."""
    known = architectures()
    return next((name for first, name in reversed(known) if first <= cc), known[0][1])


def cuda_context_bytes(architecture: str, cuda_version: str | None = None, *, cudnn: bool = False,
                       training: bool = True) -> int:
    """Typical memory of the CUDA context (+ cuDNN when loaded) outside the allocator, as nvidia-smi counts it. An
    architecture the CUDA version does not run (null in its row) takes the row's largest figure."""
    table = _context_table()
    row_name = _cuda_row(cuda_version)
    row = table["context_mib"][row_name]
    mib = row.get(architecture)
    if mib is None:
        mib = max(v for v in row.values() if v is not None)
    if cudnn:
        mib += table["cudnn_mib"][row_name]
    if training:
        mib += table.get("training_mib", {}).get(row_name, 0)
    return int(mib) * MIB


def cublas_context_bytes(cuda_version: str | None, *, training: bool = True) -> int:
    """What loading cuBLAS adds to the context (a step without a GEMM never loads it); 0 where not measured."""
    row = _context_table().get("cublas_mib", {}).get(_cuda_row(cuda_version), {})
    return int(row.get("training" if training else "inference", 0)) * MIB


def context_spread_bytes(measured_profile: bool) -> int:
    """How far a context figure may be off: a calibrated GPU's spread across its steps, else the table's."""
    spread = _context_table().get("spread_mib", {})
    return int(spread.get("profile" if measured_profile else "table", 100)) * MIB


def cublas_workspace_bytes(cc: tuple[int, int]) -> int:
    """One cuBLAS handle's workspace: PyTorch's CUBLAS_WORKSPACE_CONFIG default for this compute capability."""
    ws = _context_table()["workspace"]["cublas_bytes"]
    return int(ws.get(f"{cc[0]}.{cc[1]}", ws["default"]))


def cublaslt_workspace_bytes() -> int:
    return int(_context_table()["workspace"]["cublaslt_bytes"])


def workspace_allocations(cc: tuple[int, int], *, training: bool) -> list[int]:
    """The workspace allocations PyTorch makes through its caching allocator in one step, in order.

    One cuBLAS + cuBLASLt workspace per handle; training runs GEMMs on two threads (the caller's and autograd's
    backward thread), each with its own handle.
    """
    one = [cublas_workspace_bytes(cc), cublaslt_workspace_bytes()]
    return one * (2 if training else 1)


def default_cc() -> tuple[int, int]:
    """The compute capability assumed when no GPU is named: an A100's (the most common training GPU)."""
    return (8, 0)


# ------------------------------------------------------------------------------------------------ this machine


@lru_cache(maxsize=1)
def local_gpu_names() -> tuple[str, ...]:
    """Names of this machine's NVIDIA GPUs as NVML reports them, by index ("" for one NVML cannot name); () without
    a driver (asked once)."""
    with nvml.session() as failure:
        if failure is not None:
            return ()
        count = nvml.query("nvmlDeviceGetCount")
        if count is None:
            return ()
        names = []
        for i in range(int(count)):
            handle = nvml.query("nvmlDeviceGetHandleByIndex", i)
            name = nvml.query("nvmlDeviceGetName", handle) if handle is not None else None
            names.append(nvml.text(name) if name is not None else "")
        return tuple(names)


def local_gpu(index: int = 0) -> GpuSpec | None:
    """The catalogue entry of this machine's GPU `index`, or None (no GPU, or one the catalogue does not know)."""
    names = local_gpu_names()
    if index >= len(names) or not names[index]:
        return None
    try:
        return find_gpu(names[index])
    except UserError:
        return None


def cuda_device_gpu() -> GpuSpec | None:
    """The catalogue entry of the GPU torch computes on here: its current CUDA device, as CUDA_VISIBLE_DEVICES
    numbers it (NVML's index 0 may be another card on a machine with mixed GPUs); None without CUDA.

    Asking never starts CUDA (that would take a context's hundreds of MiB of the user's GPU for an estimate):
    before CUDA starts, the current device is CUDA_VISIBLE_DEVICES' first, which NVML names."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # unannotated in torch
            return find_gpu(torch.cuda.get_device_name())
        return local_gpu(torch.cuda._get_nvml_device_index(0))
    except Exception:  # noqa: BLE001 - a broken CUDA install, or a GPU the catalogue does not know
        return None


def is_this_machines_gpu(spec: GpuSpec | None) -> bool:
    """The target is the GPU torch runs on here, so what is measured here (context, kernels) is the target's."""
    return spec is not None and spec == cuda_device_gpu()
