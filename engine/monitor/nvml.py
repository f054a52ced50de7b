"""Live snapshots of the local NVIDIA GPUs through NVML (engine.core.nvml, the one door to the `pynvml` binding).

Every NVML call goes through `NvmlSource.query`: a metric the GPU does not support, a denied process list, a
function missing from an old driver → that one value becomes "not available" and the rest of the sample goes on.
A GPU that falls off the bus is reported per GPU and picked up again when it answers; no driver → a plain reason.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.nvml import GATEWAY, NotAvailable, Nvml, text
from .samples import (
    GPU_ERROR,
    GPU_LOST,
    GPU_OK,
    GpuSnapshot,
    MigDeviceInfo,
    ProcessInfo,
    Snapshot,
)

# NVML's own constants, used when a binding (or a test stand-in) does not define them.
_TEMPERATURE_GPU = 0
_CLOCK_SM = 1
_CLOCK_MEM = 2
_PCIE_TX = 0
_PCIE_RX = 1
_MIG_ENABLE = 1
_MEMORY_V2 = 0x02000028

# Error class names of pynvml, grouped by what they mean for the sample.
_GPU_GONE = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired", "NVMLError_GpuNotFound")
_NVML_DOWN = ("NVMLError_Uninitialized", "NVMLError_DriverNotLoaded", "NVMLError_LibRmVersionMismatch",
              "NVMLError_LibraryNotFound")
_TRY_OLDER = ("NVMLError_FunctionNotFound", "NVMLError_ArgumentVersionMismatch", "NVMLError_Deprecated")
_NOT_IN_DRIVER = "not in this driver version"


class CallTimeout(Exception):
    """An NVML call did not return in time (a hung driver); later calls fail fast until it returns."""


# a call handed to the driver thread: (function, args, kwargs, set when done, {"value"|"error": …})
_Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], threading.Event, dict[str, Any]]


class TimedCalls:
    """Runs calls on one daemon thread and waits at most `timeout` seconds for each, so a driver call that
    hangs never holds the sampler (or `Sampler.stop()`, or the app's quit) with it. While a timed-out call is
    still stuck, further calls raise CallTimeout at once instead of queueing behind it."""

    def __init__(self, timeout: float = 3.0):
        self.timeout = timeout
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._busy_since: float | None = None  # monotonic start of the call now running

    def _run(self) -> None:
        while True:
            fn, args, kwargs, done, box = self._jobs.get()
            self._busy_since = time.monotonic()
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as e:  # handed to the caller, whatever it is
                box["error"] = e
            finally:
                self._busy_since = None
                done.set()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        busy = self._busy_since
        if busy is not None and time.monotonic() - busy > self.timeout:
            raise CallTimeout(f"the driver has not answered for {time.monotonic() - busy:.1f} s")
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="vramscope-nvml", daemon=True)
            self._thread.start()
        done = threading.Event()
        box: dict[str, Any] = {}
        self._jobs.put((fn, args, kwargs, done, box))
        if not done.wait(self.timeout):
            raise CallTimeout(f"the driver did not answer within {self.timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]


class GpuGone(Exception):
    """One GPU stopped answering (lost, needs reset): that GPU is reported as lost, the others go on."""


class NvmlDown(Exception):
    """NVML as a whole is unusable (no library, driver not loaded, not initialised)."""


def proc_details(pid: int) -> tuple[str | None, str | None]:
    """(user, command) of a process from /proc; raises PermissionError/ProcessLookupError when denied/gone."""
    base = f"/proc/{pid}"
    if not os.path.isdir("/proc/self"):
        return None, None  # no procfs (Windows, macOS): details are not available here
    try:
        uid = os.stat(base).st_uid
    except FileNotFoundError as e:
        raise ProcessLookupError(pid) from e
    try:
        import pwd

        user = pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        user = str(uid)
    with open(f"{base}/cmdline", "rb") as f:
        parts = [p for p in f.read().split(b"\0") if p]
    if not parts:
        with open(f"{base}/comm", "rb") as f:
            parts = [f.read().strip()]
    return user, " ".join(text(p) for p in parts)


class NvmlSource:
    """Produces `Snapshot`s of the local GPUs through the NVML gateway (engine.core.nvml): the process's, or one of its
    own over `binding`, a stand-in with pynvml's names (tests/fake_nvml.py).

    Not thread-safe: one sampler thread (or the CLI) calls `sample()`.
    """

    def __init__(
        self,
        binding: Any = None,
        *,
        process_details: Callable[[int], tuple[str | None, str | None]] = proc_details,
        retry_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        call_timeout: float = 3.0,
    ):
        self._nvml = Nvml(binding) if binding is not None else GATEWAY
        self._details = process_details
        self._retry_s = retry_s
        self._clock = clock
        self._initialised = False  # this source holds one of the gateway's starts
        self._init_error: str | None = None
        self._init_tried_at: float | None = None
        self._driver: str | None = None
        self._identity: dict[int, tuple[str | None, str | None]] = {}
        self._mem_v2: dict[int, bool] = {}  # per GPU: does memory info v2 work (False → use v1, don't retry)
        self._first_fn: dict[str, str] = {}  # per call group: the version of the function that answered
        self._calls = TimedCalls(call_timeout)

    # -- the one guarded query --------------------------------------------------------------------------
    def query(self, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call one NVML function (on the driver thread, timed): its value, or NotAvailable(reason). Raises GpuGone /
        NvmlDown only."""
        try:
            value = self._calls.call(self._nvml.ask, fn_name, *args, **kwargs)
        except CallTimeout as e:
            return NotAvailable(f"timed out: {e}", "NVMLError_Timeout")
        if isinstance(value, NotAvailable):
            if value.code in _GPU_GONE:
                raise GpuGone(value.reason)
            if value.code in _NVML_DOWN:
                raise NvmlDown(value.reason)
        return value

    def query_first(self, group: str, candidates: list[tuple[str, tuple[Any, ...]]]) -> Any:
        """Try versions of one call, newest first, moving on only when the driver lacks one; the version that
        answered is remembered (per group: one driver serves all GPUs) so an old driver costs one failed call."""
        known = self._first_fn.get(group)
        if known is not None:
            candidates = [c for c in candidates if c[0] == known] or candidates
        result: Any = NotAvailable(_NOT_IN_DRIVER, "NVMLError_FunctionNotFound")
        for fn_name, args in candidates:
            result = self.query(fn_name, *args)
            if not isinstance(result, NotAvailable):
                self._first_fn[group] = fn_name
                return result
            if result.code not in _TRY_OLDER:
                return result  # a real answer (not supported, denied): older versions would say the same
        return result

    # -- life cycle -------------------------------------------------------------------------------------
    def _try_init(self, now: float) -> str | None:
        if self._init_tried_at is not None and now - self._init_tried_at < self._retry_s:
            return self._init_error
        self._init_tried_at = now
        try:
            failure = self._calls.call(self._nvml.start)
        except CallTimeout as e:
            failure = f"NVML could not start: {e}"
        if failure is not None:
            self._init_error = str(failure)
            return self._init_error
        self._initialised = True
        self._init_error = None
        try:
            v = self.query("nvmlSystemGetDriverVersion")
        except (GpuGone, NvmlDown):
            v = NotAvailable("")
        self._driver = text(v) if not isinstance(v, NotAvailable) else None
        return None

    def _release(self) -> None:
        """Give back this source's start of NVML (the gateway shuts it down after its last user)."""
        if self._initialised:
            self._initialised = False
            try:
                self._calls.call(self._nvml.stop)
            except CallTimeout:  # a driver that hangs: its shutdown is not worth waiting for
                pass

    def close(self) -> None:
        self._release()

    @property
    def error(self) -> str | None:
        return self._init_error

    # -- sampling ---------------------------------------------------------------------------------------
    def sample(self) -> Snapshot:
        """A snapshot; never raises: every failure is a state of the snapshot or of one GPU in it."""
        now = self._clock()
        try:
            return self._sample(now)
        except Exception as e:  # a fault none of the guards foresaw: this sample says so, the next one tries again
            self._release()
            self._init_tried_at = None
            return Snapshot(time=now, error=f"NVML failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}")

    def _sample(self, now: float) -> Snapshot:
        if not self._initialised:
            reason = self._try_init(now)
            if reason:
                return Snapshot(time=now, error=reason)
        try:
            count = self.query("nvmlDeviceGetCount")
            if isinstance(count, NotAvailable):
                return Snapshot(time=now, error=f"cannot count the GPUs: {count.reason}", driver_version=self._driver)
            gpus = tuple(self._sample_gpu(i) for i in range(int(count)))
        except GpuGone as e:  # counting the GPUs hit a lost one: nothing to list this time
            return Snapshot(time=now, error=f"cannot count the GPUs: {e}", driver_version=self._driver)
        except NvmlDown as e:
            # the driver went away under us: start over (with the retry delay) on the next sample
            self._release()
            self._init_error = str(e)
            self._init_tried_at = now
            return Snapshot(time=now, error=str(e))
        return Snapshot(time=now, gpus=gpus, driver_version=self._driver)

    def _sample_gpu(self, i: int) -> GpuSnapshot:
        name, uuid = self._identity.get(i, (None, None))
        try:
            h = self.query("nvmlDeviceGetHandleByIndex", i)
            if isinstance(h, NotAvailable):
                return GpuSnapshot(index=i, name=name, uuid=uuid, status=GPU_ERROR, error=h.reason)
            return self._read_gpu(i, h)
        except (NvmlDown, CallTimeout):
            raise
        except GpuGone as e:
            # keep the last known name so the user sees which GPU went away
            self._mem_v2.pop(i, None)
            return GpuSnapshot(index=i, name=name, uuid=uuid, status=GPU_LOST, error=str(e))
        except Exception as e:  # a value NVML returned in a shape we did not expect: this GPU says so
            return GpuSnapshot(index=i, name=name, uuid=uuid, status=GPU_ERROR,
                               error=f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")

    def _read_gpu(self, i: int, h: Any) -> GpuSnapshot:
        nvml = self._nvml
        na: list[tuple[str, str]] = []

        def val(field: str, v: Any) -> Any:
            if isinstance(v, NotAvailable):
                na.append((field, v.reason))
                return None
            return v

        name = val("name", self.query("nvmlDeviceGetName", h))
        uuid = val("uuid", self.query("nvmlDeviceGetUUID", h))
        name = text(name) if name is not None else None
        uuid = text(uuid) if uuid is not None else None
        self._identity[i] = (name, uuid)

        total, used, free, reserved = self._memory(i, h, na)

        util = val("util_gpu", self.query("nvmlDeviceGetUtilizationRates", h))
        util_gpu = util.gpu if util is not None else None
        util_mem = util.memory if util is not None else None
        if util is None:
            na.append(("util_memory", na[-1][1]))
        sensor = nvml.constant("NVML_TEMPERATURE_GPU", _TEMPERATURE_GPU)
        # nvmlDeviceGetTemperature is deprecated (to go in CUDA 14); older drivers only have it
        temp = val("temperature_c", self.query_first("temperature", [("nvmlDeviceGetTemperatureV", (h, sensor)),
                                                                     ("nvmlDeviceGetTemperature", (h, sensor))]))
        power = val("power_mw", self.query("nvmlDeviceGetPowerUsage", h))
        limit = self.query("nvmlDeviceGetEnforcedPowerLimit", h)
        if isinstance(limit, NotAvailable):
            limit = self.query("nvmlDeviceGetPowerManagementLimit", h)
        limit = val("power_limit_mw", limit)
        fan = val("fan_percent", self.query("nvmlDeviceGetFanSpeed", h))
        sm = val("clock_sm_mhz", self.query("nvmlDeviceGetClockInfo", h, nvml.constant("NVML_CLOCK_SM", _CLOCK_SM)))
        mclk = val("clock_mem_mhz",
                   self.query("nvmlDeviceGetClockInfo", h, nvml.constant("NVML_CLOCK_MEM", _CLOCK_MEM)))
        tx = val("pcie_tx_kbs", self.query("nvmlDeviceGetPcieThroughput", h,
                                           nvml.constant("NVML_PCIE_UTIL_TX_BYTES", _PCIE_TX)))
        rx = val("pcie_rx_kbs", self.query("nvmlDeviceGetPcieThroughput", h,
                                           nvml.constant("NVML_PCIE_UTIL_RX_BYTES", _PCIE_RX)))
        mig_mode, mig_devices = self._mig(h, na)
        processes = self._processes(i, h, na)
        return GpuSnapshot(
            index=i, name=name, uuid=uuid, status=GPU_OK,
            memory_total=_int(total), memory_used=_int(used), memory_free=_int(free), memory_reserved=_int(reserved),
            util_gpu=_int(util_gpu), util_memory=_int(util_mem), temperature_c=_int(temp),
            power_mw=_int(power), power_limit_mw=_int(limit), fan_percent=_int(fan),
            clock_sm_mhz=_int(sm), clock_mem_mhz=_int(mclk), pcie_tx_kbs=_int(tx), pcie_rx_kbs=_int(rx),
            mig_mode=mig_mode, mig_devices=mig_devices, processes=processes, unavailable=tuple(na),
        )

    def _memory(self, i: int, h: Any, na: list[tuple[str, str]]) -> tuple[Any, Any, Any, Any]:
        # v2 adds the driver's reserve and reports `used` without it (as nvidia-smi does on newer drivers)
        if self._mem_v2.get(i, True):
            m = self.query("nvmlDeviceGetMemoryInfo", h, version=self._nvml.constant("nvmlMemory_v2", _MEMORY_V2))
            if not isinstance(m, NotAvailable):
                self._mem_v2[i] = True
                return m.total, m.used, m.free, getattr(m, "reserved", None)
            if m.code in ("NVMLError_FunctionNotFound", "NVMLError_NotSupported",
                          "NVMLError_ArgumentVersionMismatch", "NVMLError_InvalidArgument"):
                self._mem_v2[i] = False  # an old driver: don't ask again every second
        m = self.query("nvmlDeviceGetMemoryInfo", h)
        if isinstance(m, NotAvailable):
            for f in ("memory_total", "memory_used", "memory_free", "memory_reserved"):
                na.append((f, m.reason))
            return None, None, None, None
        na.append(("memory_reserved", "not in this driver version"))
        return m.total, m.used, m.free, None

    def _mig(self, h: Any, na: list[tuple[str, str]]) -> tuple[bool | None, tuple[MigDeviceInfo, ...]]:
        mode = self.query("nvmlDeviceGetMigMode", h)
        if isinstance(mode, NotAvailable):
            na.append(("mig_mode", mode.reason))
            return None, ()
        current = mode[0] if isinstance(mode, (list, tuple)) else mode
        enabled = current == self._nvml.constant("NVML_DEVICE_MIG_ENABLE", _MIG_ENABLE)
        if not enabled:
            return False, ()
        n = self.query("nvmlDeviceGetMaxMigDeviceCount", h)
        if isinstance(n, NotAvailable):
            na.append(("mig_devices", n.reason))
            return True, ()
        out = []
        for j in range(int(n)):
            mh = self.query("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
            if isinstance(mh, NotAvailable):
                continue  # an empty slot answers NotFound
            uuid = self.query("nvmlDeviceGetUUID", mh)
            mem = self.query("nvmlDeviceGetMemoryInfo", mh)
            gi = self.query("nvmlDeviceGetGpuInstanceId", mh)
            ci = self.query("nvmlDeviceGetComputeInstanceId", mh)
            out.append(MigDeviceInfo(
                index=j,
                uuid=None if isinstance(uuid, NotAvailable) else text(uuid),
                memory_total=None if isinstance(mem, NotAvailable) else int(mem.total),
                memory_used=None if isinstance(mem, NotAvailable) else int(mem.used),
                gpu_instance_id=None if isinstance(gi, NotAvailable) else int(gi),
                compute_instance_id=None if isinstance(ci, NotAvailable) else int(ci),
            ))
        return True, tuple(out)

    def _process_list(self, kind: str, h: Any) -> Any:
        base = "nvmlDeviceGetComputeRunningProcesses" if kind == "C" else "nvmlDeviceGetGraphicsRunningProcesses"
        return self.query_first(base, [(base + "_v3", (h,)), (base + "_v2", (h,)), (base, (h,))])

    def _processes(self, i: int, h: Any, na: list[tuple[str, str]]) -> tuple[ProcessInfo, ...]:
        merged: dict[int, dict[str, Any]] = {}  # pid -> kinds (C, G), memory, MIG instance
        answered = False
        reason = None
        for kind in ("C", "G"):
            lst = self._process_list(kind, h)
            if isinstance(lst, NotAvailable):
                reason = reason or lst.reason
                continue
            answered = True
            for p in lst:
                pid = int(p.pid)
                mem = getattr(p, "usedGpuMemory", None)
                gi = getattr(p, "gpuInstanceId", None)
                if gi is not None and gi >= 0xFFFFFFFF:
                    gi = None  # NVML's "not applicable" outside MIG
                e = merged.setdefault(pid, {"kinds": [], "mem": None, "gi": gi})
                e["kinds"].append(kind)
                if mem is not None:
                    e["mem"] = max(int(mem), e["mem"] or 0)  # the same process listed twice holds one amount
        if not answered and reason:
            na.append(("processes", reason))
        out = []
        for pid, e in sorted(merged.items()):
            denied = False
            try:
                user, cmd = self._details(pid)
            except PermissionError:
                user, cmd, denied = None, None, True  # another user's process under a strict /proc
            except OSError:
                user, cmd = None, None  # it exited between NVML's list and our look (ProcessLookupError)
            out.append(ProcessInfo(pid=pid, gpu_index=i, used_bytes=e["mem"], kind="+".join(e["kinds"]),
                                   user=user, command=cmd, gpu_instance_id=e["gi"], denied=denied))
        return tuple(out)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def snapshot_once(binding: Any = None) -> Snapshot:
    """One snapshot, NVML opened and closed around it (for the CLI's --once)."""
    src = NvmlSource(binding)
    try:
        return src.sample()
    finally:
        src.close()
