"""The monitor's source with NVML replaced at the binding boundary by the tests' one stand-in (tests/fake_nvml.py:
the real pynvml error classes, scripted GPUs)."""

from __future__ import annotations

import sys

import pytest

from engine.core.nvml import NotAvailable
from engine.core.units import GIB, MIB, format_bytes
from engine.monitor.nvml import NvmlSource
from engine.monitor.samples import GPU_LOST, GPU_OK
from tests.fake_nvml import DENIED_PID, FakeNvml, source, three_gpus


def test_several_gpus_with_published_figures():
    snap = source(FakeNvml(three_gpus())).sample()
    assert snap.error is None and snap.driver_version == "535.104.05"
    g0, g1, g2 = snap.gpus
    assert [g.index for g in snap.gpus] == [0, 1, 2]
    assert g0.name == "NVIDIA A100-SXM4-80GB" and all(g.ok for g in snap.gpus)
    assert format_bytes(g0.memory_total) == "80.00 GiB"  # nvidia-smi: 81920MiB
    assert format_bytes(g1.memory_total) == "44.99 GiB"  # nvidia-smi: 46068MiB
    assert g0.memory_total == g0.memory_used + g0.memory_free + g0.memory_reserved
    assert g0.memory_reserved == 559 * MIB
    assert (g0.util_gpu, g0.util_memory, g0.temperature_c) == (87, 45, 61)
    assert g0.power_mw == 312_000 and g0.power_limit_mw == 400_000 and g0.power_fraction == pytest.approx(0.78)
    assert (g0.clock_sm_mhz, g0.clock_mem_mhz, g0.pcie_tx_kbs, g0.pcie_rx_kbs) == (1410, 1593, 1000, 2000)
    assert g0.mig_mode is False and g0.mig_devices == ()
    assert [(p.pid, p.used_bytes, p.user) for p in g0.processes] == [(1111, 20000 * MIB, "alice"),
                                                                    (2222, 9000 * MIB, "bob")]


def test_not_supported_metrics_become_unavailable_and_the_rest_goes_on():
    g1 = source(FakeNvml(three_gpus())).sample().gpus[1]
    assert g1.fan_percent is None and g1.pcie_tx_kbs is None and g1.pcie_rx_kbs is None
    assert g1.why_unavailable("fan_percent") == "not supported by this GPU"
    assert g1.why_unavailable("pcie_rx_kbs") == "not supported by this GPU"
    assert g1.temperature_c == 29 and g1.power_limit_mw == 300_000 and g1.mig_mode is None


def test_process_with_access_denied_and_merged_compute_graphics():
    g1 = source(FakeNvml(three_gpus())).sample().gpus[1]
    by_pid = {p.pid: p for p in g1.processes}
    denied = by_pid[DENIED_PID]
    assert denied.used_bytes == 512 * MIB and denied.user is None and denied.command is None and denied.denied
    assert by_pid[3333].kind == "G" and by_pid[3333].user == "alice"


def test_process_list_denied_by_nvml_leaves_gpu_figures():
    gpus = three_gpus()
    gpus[0].denied = {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"}
    fake = FakeNvml(gpus)
    g0 = source(fake).sample().gpus[0]
    assert g0.processes == () and g0.why_unavailable("processes") == "permission denied"
    assert g0.memory_used == 30000 * MIB
    # a denial is an answer: the older versions of the function are not tried
    assert "nvmlDeviceGetComputeRunningProcesses_v2" not in fake.calls


def test_mig_devices():
    g2 = source(FakeNvml(three_gpus())).sample().gpus[2]
    assert g2.mig_mode is True
    assert [(m.index, m.uuid, m.memory_total, m.gpu_instance_id) for m in g2.mig_devices] == [
        (0, "MIG-aaaa", 9856 * MIB, 7), (1, "MIG-bbbb", 9856 * MIB, 8)]
    assert g2.util_gpu is None and g2.why_unavailable("util_gpu") == "not supported by this GPU"
    (p,) = g2.processes
    assert p.used_bytes is None and p.gpu_instance_id == 7


def test_gpu_lost_and_back():
    fake = FakeNvml(three_gpus())
    src = source(fake)
    assert src.sample().gpus[1].ok
    fake.gpus[1].lost = True
    snap = src.sample()
    g1 = snap.gpus[1]
    assert g1.status == GPU_LOST and "lost" in g1.error and g1.name == "NVIDIA A40"  # still says which one
    assert g1.memory_used is None
    assert snap.gpus[0].ok and snap.gpus[0].memory_used == 30000 * MIB  # the others carry on
    fake.gpus[1].lost = False
    g1 = src.sample().gpus[1]
    assert g1.status == GPU_OK and g1.temperature_c == 29


def test_old_driver_falls_back_to_v1_and_asks_v2_once():
    fake = FakeNvml(three_gpus(), old_driver=True)
    src = source(fake)
    for _ in range(3):
        g0 = src.sample().gpus[0]
    assert g0.memory_reserved is None and g0.why_unavailable("memory_reserved")
    assert g0.memory_used == (30000 + 559) * MIB  # v1 counts the reserve as used
    assert g0.memory_free == (81920 - 30000 - 559) * MIB
    assert [p.pid for p in g0.processes] == [1111, 2222]
    assert fake.calls.count("nvmlDeviceGetMemoryInfo_v2") == 3  # once per GPU, never again
    # the driver is one for all GPUs: the missing process functions are found out once
    assert fake.calls.count("nvmlDeviceGetComputeRunningProcesses_v3") == 1
    assert fake.calls.count("nvmlDeviceGetComputeRunningProcesses") == 9


def test_library_missing_then_installed_with_retry_delay():
    fake = FakeNvml(three_gpus(), library_missing=True)
    t = [100.0]
    src = source(fake, retry_s=5.0, clock=lambda: t[0])
    snap = src.sample()
    assert snap.gpus == () and "NVIDIA driver not installed" in snap.error
    fake.library_missing = False
    t[0] = 102.0
    assert src.sample().error and fake.inits == 1  # not retried before the delay
    t[0] = 106.0
    snap = src.sample()
    assert snap.error is None and len(snap.gpus) == 3


def test_driver_unloaded_mid_session_recovers():
    fake = FakeNvml(three_gpus())
    t = [0.0]
    src = source(fake, retry_s=1.0, clock=lambda: t[0])
    assert src.sample().error is None
    fake.driver_unloaded = True
    t[0] = 1.0
    snap = src.sample()
    assert snap.gpus == () and snap.error
    fake.driver_unloaded = False
    t[0] = 2.5
    assert len(src.sample().gpus) == 3 and fake.inits == 2


def test_function_missing_from_binding_is_not_available():
    fake = FakeNvml(three_gpus())
    src = source(fake)
    src.sample()
    r = src.query("nvmlDeviceGetSomethingFromTheFuture", None)
    assert isinstance(r, NotAvailable) and not r and r.reason == "not in this driver version"


def test_binding_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    snap = NvmlSource().sample()
    assert snap.gpus == () and "nvidia-ml-py" in snap.error


def test_real_binding_without_driver():
    snap = NvmlSource().sample()
    if snap.gpus:
        pytest.skip("this machine has an NVIDIA driver; benchmarks/check_monitor.py covers it")
    assert snap.error and "NVIDIA" in snap.error


def test_json_round_trip_of_a_sample():
    from engine.monitor.samples import Snapshot

    snap = source(FakeNvml(three_gpus())).sample()
    assert Snapshot.from_json(snap.to_json()) == snap
    assert snap.gpus[0].memory_total / GIB == 80
