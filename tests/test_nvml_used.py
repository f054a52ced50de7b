"""This process's GPU memory as nvidia-smi shows it (engine.cuda.nvml_used) and the CUDA context measured from it
(engine.cuda.device_model.measure_context_bytes), with the process's NVML replaced by the tests' one stand-in
(tests/fake_nvml.py, through conftest's `fake_nvml`): the process's own figure where NVML lists it, the device's used
memory where a container hides the PIDs or NVML refuses the process list, nothing where NVML cannot start; NVML
shut down after every question."""

from __future__ import annotations

import os

import pytest
import torch

from engine.core import nvml
from engine.cuda import device_model
from engine.cuda.nvml_used import nvml_used_bytes, process_used_bytes
from tests.fake_nvml import NA_GI, FakeGpu

MiB = 1 << 20


def _h200(compute=(), denied=()) -> FakeGpu:
    # 143771 MiB: nvidia-smi's Total of an H200 (resources/gpus.json)
    return FakeGpu("NVIDIA H200", 143771, 700, used_mib=5120, compute=compute, denied=denied)


@pytest.mark.parametrize(("compute", "denied", "expected"), [
    ([(1, 3072 * MiB, NA_GI), (os.getpid(), 2048 * MiB, NA_GI)], (), 2048 * MiB),  # this process's own line
    ([(1, 3072 * MiB, NA_GI)], (), 5120 * MiB),  # the PIDs of a container: the device's used memory
    ([(os.getpid(), None, NA_GI)], (), 5120 * MiB),  # listed without a figure
    ([], ("nvmlDeviceGetComputeRunningProcesses",), 5120 * MiB),  # the process query refused
])
def test_used_bytes_and_driver(fake_nvml, compute, denied, expected):
    fake_nvml.gpus = [_h200(), _h200(compute, denied)]
    assert nvml_used_bytes(1) == (expected, "535.104.05")
    assert (fake_nvml.inits, fake_nvml.shutdowns, nvml.GATEWAY.users) == (1, 1, 0)


def test_process_used_bytes_says_none_for_a_refused_query(fake_nvml):
    """The context measurement keeps its last figure instead (a device's used memory counts other processes)."""
    fake_nvml.gpus = [_h200(denied={"nvmlDeviceGetComputeRunningProcesses"}), _h200([(os.getpid(), MiB, NA_GI)])]
    with nvml.session() as failure:
        assert failure is None
        refused, mine = (process_used_bytes(nvml.query("nvmlDeviceGetHandleByIndex", i)) for i in (0, 1))
    assert (refused, mine) == (None, MiB)


def test_no_nvml_says_nothing(fake_nvml):
    fake_nvml.library_missing = True
    assert nvml_used_bytes(0) == (None, None)
    assert fake_nvml.shutdowns == 0 and nvml.GATEWAY.users == 0  # a failed start holds nothing


def test_a_gpu_index_nvml_does_not_have_says_nothing(fake_nvml):
    fake_nvml.gpus = [_h200()]
    assert nvml_used_bytes(3) == (None, None)
    assert fake_nvml.shutdowns == 1


def _cuda_up(monkeypatch, reserved: int) -> None:
    """torch answering as on a GPU machine with CUDA started and `reserved` bytes in its caching allocator."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: reserved)
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **k: real_zeros(*a, **k))
    monkeypatch.setattr(device_model, "_measured_context", None)


def test_context_is_the_process_figure_less_the_reserve(fake_nvml, monkeypatch):
    """The H200's measured context (cuda_context.json: NVML used − reserved, 684 MiB after an inference pass)."""
    _cuda_up(monkeypatch, reserved=256 * MiB)
    fake_nvml.gpus = [_h200([(os.getpid(), (256 + 684) * MiB, NA_GI)])]
    assert device_model.measure_context_bytes() == 684 * MiB
    # a refused process list later: the measured figure stands, not the device's (other processes') used memory
    fake_nvml.gpus[0].denied = {"nvmlDeviceGetComputeRunningProcesses"}
    assert device_model.measure_context_bytes() == 684 * MiB
    assert fake_nvml.inits == fake_nvml.shutdowns == 2


def test_context_without_nvml_falls_back_to_the_table(fake_nvml, monkeypatch):
    _cuda_up(monkeypatch, reserved=0)
    fake_nvml.library_missing = True
    assert device_model.measure_context_bytes() is None  # device_detail then takes the profile or the table


def test_no_gpu_on_this_machine_with_the_real_binding():
    """This CPU machine (no driver, or no nvidia-ml-py): every user of NVML says "no GPU", none raises."""
    from engine.config.gpus import local_gpu, local_gpu_names

    probe = nvml.Nvml()
    failure = probe.start()
    if failure is None:
        probe.stop()
        pytest.skip("this machine has an NVIDIA driver; benchmarks/validate_gpu.py covers it")
    assert "NVIDIA" in failure or "nvidia-ml-py" in failure
    local_gpu_names.cache_clear()
    assert local_gpu_names() == () and local_gpu(0) is None
    assert nvml_used_bytes(0) == (None, None)
    assert nvml.GATEWAY.users == 0
