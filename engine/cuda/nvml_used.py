"""This process's GPU memory as nvidia-smi shows it, read from NVML (through engine.core.nvml): what the real CUDA
profile reports as nvidia-smi's figure and what the CUDA context measurement (engine.cuda.device_model) subtracts the
caching allocator's reserved memory from."""

from __future__ import annotations

import os
from typing import Any

from ..core import nvml


def process_used_bytes(handle: Any) -> int | None:
    """This process's used memory on the device `handle` (NVML started by the caller); the device's used memory where
    the process list does not name this process (containers often hide PIDs); None where NVML refuses the process
    list or cannot say."""
    processes = nvml.query("nvmlDeviceGetComputeRunningProcesses", handle)
    if processes is None:
        return None
    used = None
    for p in processes:
        if p.pid == os.getpid() and p.usedGpuMemory:
            used = int(p.usedGpuMemory)
    return used if used is not None else device_used_bytes(handle)


def device_used_bytes(handle: Any) -> int | None:
    """The device's used memory (every process's, as nvidia-smi's total line); None where NVML cannot say."""
    memory = nvml.query("nvmlDeviceGetMemoryInfo", handle)
    return int(memory.used) if memory is not None else None


def nvml_used_bytes(device_index: int = 0) -> tuple[int | None, str | None]:
    """(this process's used GPU memory as nvidia-smi shows it, driver version); None where NVML cannot say (no GPU,
    no driver: (None, None)). A refused process list gives the device's used memory."""
    with nvml.session() as failure:
        if failure is not None:
            return None, None
        handle = nvml.query("nvmlDeviceGetHandleByIndex", device_index)
        if handle is None:
            return None, None
        driver = nvml.query("nvmlSystemGetDriverVersion")
        used = process_used_bytes(handle)
        if used is None:
            used = device_used_bytes(handle)
        return used, nvml.text(driver) if driver is not None else None
