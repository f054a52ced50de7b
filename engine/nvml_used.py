"""This process's GPU memory as nvidia-smi shows it, read from NVML: what the real CUDA profile reports as
nvidia-smi's figure and what the CUDA context measurement (engine.device_model) subtracts the caching allocator's
reserved memory from."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any


def process_used_bytes(nvml: ModuleType, handle: Any) -> int:
    """This process's used memory on the device `handle` (NVML initialised); the device's used memory where the
    process list does not name this process (containers often hide PIDs)."""
    used = None
    for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if p.pid == os.getpid() and p.usedGpuMemory:
            used = int(p.usedGpuMemory)
    return used if used is not None else int(nvml.nvmlDeviceGetMemoryInfo(handle).used)


def nvml_used_bytes(device_index: int = 0) -> tuple[int | None, str | None]:
    """(this process's used GPU memory as nvidia-smi shows it, driver version); None where NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML on this machine
        return None, None
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        try:
            used = process_used_bytes(pynvml, h)
        except Exception:  # noqa: BLE001 - process queries can be refused in containers
            used = int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
        return used, driver
    except Exception:  # noqa: BLE001
        return None, None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
