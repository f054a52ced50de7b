"""The one door to NVML, NVIDIA's management library, through the `pynvml` binding of nvidia-ml-py (in nvitop's
style): the only module that imports pynvml. NVML is started once and shut down when its last user is done
(reference-counted), and every query is guarded: it answers a value or a default (None, or `NotAvailable` with
the plain reason) and never raises.

Its users: the monitor's sampler (engine.monitor.nvml), this machine's GPU in the catalogue (engine.config.gpus), the
CUDA context measurement (engine.cuda.device_model) and the real CUDA profile's nvidia-smi figure
(engine.cuda.nvml_used). On a machine without the package or the driver each of them says "no GPU" plainly instead of
failing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

# The plain reason of each pynvml error class (by its name: the binding's classes are made at run time).
_PLAIN = {
    "NVMLError_NotSupported": "not supported by this GPU",
    "NVMLError_FunctionNotFound": "not in this driver version",
    "NVMLError_NoPermission": "permission denied",
    "NVMLError_NotFound": "not found",
    "NVMLError_NoData": "no data yet",
    "NVMLError_GpuIsLost": "GPU is lost (fell off the bus); waiting for it to come back",
    "NVMLError_ResetRequired": "GPU needs a reset",
    "NVMLError_GpuNotFound": "GPU not found",
    "NVMLError_ArgumentVersionMismatch": "not in this driver version",
    "NVMLError_InsufficientPower": "GPU lacks external power",
    "NVMLError_Timeout": "timed out",
}
# errors that mean NVML as a whole is unusable: their reason is the one a failed start gives
_DOWN = ("NVMLError_Uninitialized", "NVMLError_DriverNotLoaded", "NVMLError_LibRmVersionMismatch",
         "NVMLError_LibraryNotFound")
NOT_STARTED = "NVMLError_Uninitialized"
FUNCTION_NOT_FOUND = "NVMLError_FunctionNotFound"


class NotAvailable:
    """What a query answers instead of raising; falsy, carries the plain reason and the pynvml error class name
    (`code`, for a caller that decides on fall-backs: an older function, a GPU gone, NVML down)."""

    __slots__ = ("reason", "code")

    def __init__(self, reason: str, code: str = ""):
        self.reason = reason
        self.code = code

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"NotAvailable({self.reason!r})"


def failure_reason(err: BaseException) -> str:
    """A plain sentence for why NVML could not start on this machine."""
    name = type(err).__name__
    if isinstance(err, ImportError):
        return "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"
    if name == "NVMLError_LibraryNotFound":
        return "NVIDIA driver not installed (the NVML library libnvidia-ml was not found)"
    if name == "NVMLError_DriverNotLoaded":
        return "the NVIDIA driver is installed but not loaded (no GPU detected, or the kernel module is missing)"
    if name == "NVMLError_NoPermission":
        return "no permission to talk to the NVIDIA driver"
    if name == "NVMLError_LibRmVersionMismatch":
        return "the NVIDIA driver and its NVML library differ in version (reboot after the driver update)"
    return f"NVML could not start: {err}"


def text(v: Any) -> str:
    """A string NVML returned (older bindings give bytes)."""
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


def _installed_binding() -> Any:
    # nvidia-ml-py (an untyped module); imported when NVML is started, so the engine imports without it
    import pynvml

    return pynvml


class Nvml:
    """NVML through one binding: `binding` is a stand-in with pynvml's names (tests/fake_nvml.py), or None for the
    installed pynvml (imported at each first start, so a package installed meanwhile is found). Thread-safe."""

    def __init__(self, binding: Any = None) -> None:
        self._binding = binding
        self._lib: Any = None  # the binding while NVML runs
        self._users = 0
        self._lock = threading.Lock()

    @property
    def users(self) -> int:
        """How many users hold NVML started (0: it is shut down)."""
        return self._users

    def start(self) -> str | None:
        """Start NVML for one more user: None when it runs (started now, or already by another user), else the plain
        reason it cannot (no package, no driver, …); a failed start holds nothing to `stop`."""
        with self._lock:
            if self._users:
                self._users += 1
                return None
            try:
                lib = self._binding if self._binding is not None else _installed_binding()
                lib.nvmlInit()
            except Exception as e:  # ImportError, NVMLError_*, OSError from a broken library
                return failure_reason(e)
            self._lib = lib
            self._users = 1
            return None

    def stop(self) -> None:
        """One user is done: the last one shuts NVML down (a driver that already went away is not worth reporting)."""
        with self._lock:
            if not self._users:
                return
            self._users -= 1
            if self._users:
                return
            lib, self._lib = self._lib, None
            try:
                lib.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a driver that is gone
                pass

    @contextmanager
    def session(self) -> Iterator[str | None]:
        """`with nvml.session() as failure:` NVML started for the block (failure is None) or not (the reason)."""
        failure = self.start()
        try:
            yield failure
        finally:
            if failure is None:
                self.stop()

    def ask(self, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """The value of one NVML call, or NotAvailable(reason, code); never raises an Exception."""
        lib = self._lib
        if lib is None:
            return NotAvailable("NVML is not started", NOT_STARTED)
        fn = getattr(lib, fn_name, None)
        if fn is None:  # the binding itself is older than the function
            return NotAvailable(_PLAIN[FUNCTION_NOT_FOUND], FUNCTION_NOT_FOUND)
        nvml_error = getattr(lib, "NVMLError", None)
        mismatch = getattr(lib, "NVMLLibraryMismatchError", None)
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # every kind: an OSError from the library, a ctypes error, a binding's bug
            name = type(e).__name__
            if mismatch is not None and isinstance(e, mismatch):
                # pynvml's unversioned wrappers raise this when the driver lacks the function
                return NotAvailable(_PLAIN[FUNCTION_NOT_FOUND], FUNCTION_NOT_FOUND)
            if nvml_error is None or not isinstance(e, nvml_error):
                detail = " ".join(str(e).split())[:200]
                return NotAvailable(f"{name}: {detail}" if detail else name, name)
            if name in _DOWN:
                return NotAvailable(failure_reason(e), name)
            return NotAvailable(_PLAIN.get(name, text(e) or name), name)

    def query(self, fn_name: str, *args: Any, default: Any = None, **kwargs: Any) -> Any:
        """The value of one NVML call, or `default` where NVML cannot say (not started, not supported, refused)."""
        v = self.ask(fn_name, *args, **kwargs)
        return default if isinstance(v, NotAvailable) else v

    def constant(self, name: str, fallback: int) -> int:
        """One of NVML's constants as the binding defines it (`fallback`: NVML's value, for a binding without it)."""
        return int(getattr(self._lib, name, fallback))


GATEWAY = Nvml()  # the process's NVML (tests swap in a stand-in: tests/conftest.py's fake_nvml)


def session() -> AbstractContextManager[str | None]:
    """`with nvml.session() as failure:` the process's NVML started for the block, or the reason it is not."""
    return GATEWAY.session()


def query(fn_name: str, *args: Any, default: Any = None, **kwargs: Any) -> Any:
    """One call on the process's NVML (started by the caller's `session`); `default` where NVML cannot say."""
    return GATEWAY.query(fn_name, *args, default=default, **kwargs)
