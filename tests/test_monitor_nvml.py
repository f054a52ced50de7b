"""NVML replaced at the binding boundary by a scripted stand-in (the real pynvml error classes, fake functions).

GPU figures are the ones nvidia-smi prints for these boards (A100-SXM4-80GB: 81920 MiB, 400 W; A40: 46068 MiB,
300 W; RTX 3090: 24576 MiB, 350 W), so the formatted output is checked against what users see.
"""

from __future__ import annotations

import sys
import zlib
from types import SimpleNamespace

import pynvml
import pytest

from engine.monitor.nvml import NotAvailable, NvmlSource
from engine.monitor.snapshot import GPU_LOST, GPU_OK
from engine.units import GIB, MIB, format_bytes

E = pynvml  # the real error classes: the code under test must recognise exactly these


class FakeGpu:
    def __init__(self, name, total_mib, power_limit_w, *, used_mib=0, reserved_mib=0, util=(0, 0), temp=40,
                 power_w=60, fan=30, sm=1410, mem_clk=1593, pcie=(1000, 2000), mig=None, compute=(), graphics=(),
                 unsupported=(), denied=()):
        self.name, self.uuid = name, f"GPU-{zlib.crc32(name.encode()):08x}-fake"
        self.total = total_mib * MIB
        self.used = used_mib * MIB
        self.reserved = reserved_mib * MIB
        self.util, self.temp, self.power, self.limit = util, temp, power_w * 1000, power_limit_w * 1000
        self.fan, self.sm, self.mem_clk, self.pcie = fan, sm, mem_clk, pcie
        self.mig = mig  # None: not MIG-capable; else list of (uuid, total_mib, used_mib, gi, ci) or None for empty
        self.compute, self.graphics = list(compute), list(graphics)  # (pid, bytes | None, gpu_instance_id)
        self.unsupported = set(unsupported)  # function names answering NotSupported
        self.denied = set(denied)  # function names answering NoPermission
        self.lost = False


class FakeHandle:
    def __init__(self, gpu, mig=None):
        self.gpu, self.mig = gpu, mig


class FakeNvml:
    """Same names as pynvml for what the monitor calls; scripted answers; every call logged."""

    def __init__(self, gpus, *, library_missing=False, old_driver=False, driver="535.104.05"):
        self.gpus = list(gpus)
        self.library_missing = library_missing
        self.old_driver = old_driver  # no nvmlDeviceGetMemoryInfo_v2, no *_v2/_v3 process functions
        self.driver = driver
        self.driver_unloaded = False
        self.calls: list[str] = []
        self.inits = 0
        for k in dir(pynvml):
            if k.startswith(("NVMLError", "NVML_")) or k in ("nvmlMemory_v2", "NVMLLibraryMismatchError"):
                setattr(self, k, getattr(pynvml, k))

    # -- helpers
    def _gpu(self, h, fn):
        self.calls.append(fn)
        if self.driver_unloaded:
            raise E.NVMLError_Uninitialized()
        g = h.gpu
        if g.lost:
            raise E.NVMLError_GpuIsLost()
        if fn in g.unsupported:
            raise E.NVMLError_NotSupported()
        if fn in g.denied:
            raise E.NVMLError_NoPermission()
        return g

    def nvmlInit(self):
        self.inits += 1
        if self.library_missing:
            raise E.NVMLError_LibraryNotFound()

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        if self.driver_unloaded:
            raise E.NVMLError_Uninitialized()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.gpus[i].lost:
            raise E.NVMLError_GpuIsLost()
        return FakeHandle(self.gpus[i])

    def nvmlDeviceGetName(self, h):
        return self._gpu(h, "nvmlDeviceGetName").name.encode()  # older bindings return bytes

    def nvmlDeviceGetUUID(self, h):
        g = self._gpu(h, "nvmlDeviceGetUUID")
        return h.mig[0] if h.mig else g.uuid

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo" + ("_v2" if version else ""))
        if h.mig:
            _, total, used, _, _ = h.mig
            return SimpleNamespace(total=total * MIB, used=used * MIB, free=(total - used) * MIB)
        free = g.total - g.reserved - g.used
        if version:
            if self.old_driver:
                raise E.NVMLError_FunctionNotFound()
            return SimpleNamespace(total=g.total, reserved=g.reserved, used=g.used, free=free, version=version)
        return SimpleNamespace(total=g.total, used=g.total - free, free=free)  # v1: used includes the reserve

    def nvmlDeviceGetUtilizationRates(self, h):
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        if g.mig is not None and any(g.mig):
            raise E.NVMLError_NotSupported()  # NVML gives no utilization for a GPU in MIG mode
        return SimpleNamespace(gpu=g.util[0], memory=g.util[1])

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetPowerUsage(self, h):
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._gpu(h, "nvmlDeviceGetEnforcedPowerLimit").limit

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return self._gpu(h, "nvmlDeviceGetPowerManagementLimit").limit

    def nvmlDeviceGetFanSpeed(self, h):
        return self._gpu(h, "nvmlDeviceGetFanSpeed").fan

    def nvmlDeviceGetClockInfo(self, h, kind):
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        return {pynvml.NVML_CLOCK_SM: g.sm, pynvml.NVML_CLOCK_MEM: g.mem_clk}[kind]

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        g = self._gpu(h, "nvmlDeviceGetPcieThroughput")
        return g.pcie[0] if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else g.pcie[1]

    def nvmlDeviceGetMigMode(self, h):
        g = self._gpu(h, "nvmlDeviceGetMigMode")
        if g.mig is None:
            raise E.NVMLError_NotSupported()
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if g.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return len(self._gpu(h, "nvmlDeviceGetMaxMigDeviceCount").mig)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        g = self._gpu(h, "nvmlDeviceGetMigDeviceHandleByIndex")
        if g.mig[j] is None:
            raise E.NVMLError_NotFound()
        return FakeHandle(g, g.mig[j])

    def nvmlDeviceGetGpuInstanceId(self, h):
        return h.mig[3]

    def nvmlDeviceGetComputeInstanceId(self, h):
        return h.mig[4]

    def _procs(self, h, fn, which):
        g = self._gpu(h, fn)
        if self.old_driver and fn.endswith(("_v2", "_v3")):
            raise E.NVMLError_FunctionNotFound()
        return [SimpleNamespace(pid=p, usedGpuMemory=m, gpuInstanceId=gi, computeInstanceId=0xFFFFFFFF)
                for p, m, gi in getattr(g, which)]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h):
        return self._procs(h, "nvmlDeviceGetComputeRunningProcesses_v3", "compute")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h):
        return self._procs(h, "nvmlDeviceGetComputeRunningProcesses_v2", "compute")

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._procs(h, "nvmlDeviceGetComputeRunningProcesses", "compute")

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h):
        return self._procs(h, "nvmlDeviceGetGraphicsRunningProcesses_v3", "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, h):
        return self._procs(h, "nvmlDeviceGetGraphicsRunningProcesses_v2", "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return self._procs(h, "nvmlDeviceGetGraphicsRunningProcesses", "graphics")


NA_GI = 0xFFFFFFFF
PROCS = {
    1111: ("alice", "python train.py --bs 64"),
    2222: ("bob", "python eval.py"),
    3333: ("alice", "/usr/lib/xorg/Xorg :0"),
}
DENIED_PID = 4242


def fake_details(pid):
    if pid == DENIED_PID:
        raise PermissionError(13, "Permission denied")
    if pid not in PROCS:
        raise ProcessLookupError(pid)
    return PROCS[pid]


def three_gpus():
    """GPU 0: A100 80 GB busy with two jobs; GPU 1: A40 without fan/PCIe counters and a denied process;
    GPU 2: A100 in MIG mode with two of seven slices in use."""
    a100 = FakeGpu("NVIDIA A100-SXM4-80GB", 81920, 400, used_mib=30000, reserved_mib=559, util=(87, 45), temp=61,
                   power_w=312, fan=0, mig=[],
                   compute=[(1111, 20000 * MIB, NA_GI), (2222, 9000 * MIB, NA_GI)])
    a40 = FakeGpu("NVIDIA A40", 46068, 300, used_mib=1, reserved_mib=512, util=(0, 0), temp=29, power_w=23,
                  unsupported={"nvmlDeviceGetFanSpeed", "nvmlDeviceGetPcieThroughput"},
                  compute=[(DENIED_PID, 512 * MIB, NA_GI)], graphics=[(3333, 64 * MIB, NA_GI)])
    mig = FakeGpu("NVIDIA A100-SXM4-80GB", 81920, 400, used_mib=10240, reserved_mib=559, temp=35, power_w=90,
                  mig=[("MIG-aaaa", 9856, 5000, 7, 0), ("MIG-bbbb", 9856, 0, 8, 0), None, None, None, None, None],
                  compute=[(1111, None, 7)])  # per-process memory is withheld inside MIG slices without root
    return [a100, a40, mig]


def source(fake, **kw):
    return NvmlSource(fake, process_details=fake_details, **kw)


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
    from engine.monitor.snapshot import Snapshot

    snap = source(FakeNvml(three_gpus())).sample()
    assert Snapshot.from_json(snap.to_json()) == snap
    assert snap.gpus[0].memory_total / GIB == 80
