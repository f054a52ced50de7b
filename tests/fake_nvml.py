"""The one stand-in for NVML in the tests: pynvml's names and its real error classes, scripted GPUs, every call
logged. A test gives it to the monitor's source (`NvmlSource(FakeNvml(...))`) or, through tests/conftest.py's
`fake_nvml` fixture, makes it the process's NVML (engine.core.nvml.GATEWAY) for the catalogue's local GPU, the context
measurement and the profiler's nvidia-smi figure.

GPU figures are the ones nvidia-smi prints for these boards (A100-SXM4-80GB: 81920 MiB, 400 W; A40: 46068 MiB,
300 W; RTX 3090: 24576 MiB, 350 W), so the formatted output is checked against what users see. This module and
engine/core/nvml.py are the only ones that import pynvml (tests/test_nvml.py checks it): the stand-in raises the
binding's own error classes, so the code under test must recognise exactly these.
"""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import pynvml

from engine.core.units import MIB
from engine.monitor.nvml import NvmlSource

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
        self.shutdowns = 0
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
        self.shutdowns += 1

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
    """The monitor's source over the stand-in, with the scripted process details."""
    return NvmlSource(fake, process_details=fake_details, **kw)
