"""This process's GPU memory as nvidia-smi shows it (engine.nvml_used), with NVML replaced by a stand-in module:
the process's own figure where NVML lists it, the device's used memory where a container hides the PIDs or refuses
the process query, nothing where NVML cannot start; NVML shut down after every question."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest

from engine.nvml_used import nvml_used_bytes, process_used_bytes

GiB = 1 << 30


class _Proc:
    def __init__(self, pid: int, used: int | None) -> None:
        self.pid, self.usedGpuMemory = pid, used


def _fake_nvml(procs: list[_Proc] | Exception, device_used: int = 5 * GiB, init_fails: bool = False) -> Any:
    m: Any = types.ModuleType("pynvml")
    m.calls = []

    def init() -> None:
        m.calls.append("init")
        if init_fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def processes(handle: str) -> list[_Proc]:
        assert handle == "handle-1"
        if isinstance(procs, Exception):
            raise procs
        return procs

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetHandleByIndex = lambda i: f"handle-{i}"
    m.nvmlSystemGetDriverVersion = lambda: b"570.86.15"
    m.nvmlDeviceGetComputeRunningProcesses = processes
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=device_used, total=141 * GiB)
    return m


@pytest.mark.parametrize(("procs", "expected"), [
    ([_Proc(1, 3 * GiB), _Proc(os.getpid(), 2 * GiB)], 2 * GiB),  # this process's own line
    ([_Proc(1, 3 * GiB)], 5 * GiB),  # the PIDs of a container: the device's used memory
    ([_Proc(os.getpid(), None)], 5 * GiB),  # listed without a figure
    (RuntimeError("NVML_ERROR_NO_PERMISSION"), 5 * GiB),  # the process query refused
])
def test_used_bytes_and_driver(monkeypatch, procs, expected):
    fake = _fake_nvml(procs)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml_used_bytes(1) == (expected, "570.86.15")
    assert fake.calls == ["init", "shutdown"]


def test_process_used_bytes_lets_a_refused_query_through():
    fake = _fake_nvml(RuntimeError("NVML_ERROR_NO_PERMISSION"))
    with pytest.raises(RuntimeError):
        process_used_bytes(fake, "handle-1")  # the context measurement keeps its last figure instead
    assert process_used_bytes(_fake_nvml([_Proc(os.getpid(), GiB)]), "handle-1") == GiB


def test_no_nvml_says_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([], init_fails=True))
    assert nvml_used_bytes(0) == (None, None)
