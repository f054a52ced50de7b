"""Immutable monitor samples: one Snapshot per tick, holding a GpuSnapshot per GPU and its processes.

A value NVML could not give (not supported, denied, missing from an old driver) is None, and its field name is
listed in `GpuSnapshot.unavailable` with the reason, so views show "n/a" instead of a made-up zero.
JSON carries plain integers (bytes, milliwatts, MHz, KB/s) so a recording round-trips exactly.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

_KINDS: dict[str, tuple[type, ...]] = {"int": (int,), "str": (str,), "float": (int, float), "bool": (bool,)}


def checked_fields(cls: type, d: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of dataclass `cls` found in the recorded object `d`, each of its declared kind (a bool is not
    an int; a number within 64 bits), a required one present: ValueError naming the field otherwise."""
    if not isinstance(d, dict):
        raise ValueError(f"a {cls.__name__} is {type(d).__name__}, not an object")
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in skip:
            continue
        if f.name not in d:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ValueError(f"a {cls.__name__} without '{f.name}'")
            continue
        v, kind = d[f.name], str(f.type).split("|")[0].strip()
        if v is None and "None" in str(f.type):
            out[f.name] = v
            continue
        want = _KINDS.get(kind)
        if want is not None and (not isinstance(v, want) or (kind != "bool" and isinstance(v, bool))
                                 or (isinstance(v, (int, float)) and not abs(v) < 2**63)):
            shown = type(v).__name__ if isinstance(v, (dict, list)) else repr(v)[:20]
            raise ValueError(f"'{f.name}' is {shown}, not {'a whole number' if kind == 'int' else kind}")
        if kind == "int" and v < 0:  # a GPU's index, bytes, watts, degrees, a pid: none is below 0
            raise ValueError(f"'{f.name}' is {v}, not a whole number of 0 or more")
        out[f.name] = v
    return out

GPU_OK = "ok"
GPU_LOST = "lost"  # fell off the bus / needs a reset; the sampler keeps trying and recovers when it returns
GPU_ERROR = "error"  # any other failure to reach this one GPU


@dataclass(frozen=True)
class ProcessInfo:
    """One process holding memory on one GPU. `used_bytes` is None where NVML withholds it (MIG without root)."""

    pid: int
    gpu_index: int
    used_bytes: int | None
    kind: str = "C"  # "C" compute, "G" graphics, "C+G" both (as nvidia-smi labels them)
    user: str | None = None  # None: the OS denied the details (another user's process, a container)
    command: str | None = None
    gpu_instance_id: int | None = None  # MIG: which GPU instance the process runs in
    denied: bool = False  # True: user/command withheld by the OS (not merely unknown on this platform)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProcessInfo:
        return cls(**checked_fields(cls, d))


@dataclass(frozen=True)
class MigDeviceInfo:
    """One MIG slice of a GPU in MIG mode."""

    index: int
    uuid: str | None
    memory_total: int | None
    memory_used: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MigDeviceInfo:
        return cls(**checked_fields(cls, d))


@dataclass(frozen=True)
class GpuSnapshot:
    index: int
    name: str | None = None
    uuid: str | None = None
    status: str = GPU_OK  # GPU_OK | GPU_LOST | GPU_ERROR
    error: str | None = None  # plain reason when status != ok
    memory_total: int | None = None  # bytes
    memory_used: int | None = None
    memory_free: int | None = None
    memory_reserved: int | None = None  # driver/firmware reserve; needs memory info v2 (None on older drivers)
    util_gpu: int | None = None  # percent
    util_memory: int | None = None  # percent
    temperature_c: int | None = None
    power_mw: int | None = None
    power_limit_mw: int | None = None
    fan_percent: int | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    pcie_tx_kbs: int | None = None  # KB/s, as NVML reports it
    pcie_rx_kbs: int | None = None
    mig_mode: bool | None = None
    mig_devices: tuple[MigDeviceInfo, ...] = ()
    processes: tuple[ProcessInfo, ...] = ()
    unavailable: tuple[tuple[str, str], ...] = ()  # (field, reason) for each value NVML could not give
    # a GPU of a fleet (read from Prometheus): its machine, its index there, the last XID error it reported
    # (0: none), and the exporter's job/pod labels; all None/empty for the local GPUs
    host: str | None = None
    host_gpu: int | None = None
    xid_error: int | None = None
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == GPU_OK

    @property
    def label(self) -> str:
        """How messages name this GPU: "GPU 0" here, "node-3 GPU 5" in a fleet."""
        if self.host is not None:
            return f"{self.host} GPU {self.host_gpu if self.host_gpu is not None else self.index}"
        return f"GPU {self.index}"

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used is None or not self.memory_total:
            return None
        return self.memory_used / self.memory_total

    @property
    def power_fraction(self) -> float | None:
        if self.power_mw is None or not self.power_limit_mw:
            return None
        return self.power_mw / self.power_limit_mw

    def why_unavailable(self, name: str) -> str | None:
        for f, reason in self.unavailable:
            if f == name:
                return reason
        return None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["unavailable"] = {f: r for f, r in self.unavailable}
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuSnapshot:
        kw = checked_fields(cls, d, skip=("mig_devices", "processes", "unavailable", "labels"))
        kw["mig_devices"] = tuple(MigDeviceInfo.from_json(m) for m in _listed(d, "mig_devices"))
        kw["processes"] = tuple(ProcessInfo.from_json(p) for p in _listed(d, "processes"))
        unavailable = d.get("unavailable") or {}
        if not isinstance(unavailable, dict):
            raise ValueError(f"'unavailable' is {type(unavailable).__name__}, not an object")
        kw["unavailable"] = tuple((str(k), str(v)) for k, v in unavailable.items())
        labels = _listed(d, "labels")
        if not all(isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in labels):
            raise ValueError("'labels' holds something that is not a [name, value] pair")
        kw["labels"] = tuple((str(k), str(v)) for k, v in labels)
        return cls(**kw)


@dataclass(frozen=True)
class Snapshot:
    """Everything seen at one instant. `error` set and `gpus` empty: NVML itself is not available (no driver)."""

    time: float  # seconds since the epoch
    gpus: tuple[GpuSnapshot, ...] = ()
    error: str | None = None
    driver_version: str | None = None

    def gpu(self, index: int) -> GpuSnapshot | None:
        for g in self.gpus:
            if g.index == index:
                return g
        return None

    @property
    def processes(self) -> tuple[ProcessInfo, ...]:
        return tuple(p for g in self.gpus for p in g.processes)

    def report_summary(self) -> dict[str, Any]:
        """What a memory report shows of this instant: per GPU its memory, load and temperature, and the
        processes holding memory (bytes as integers, `*_bytes` keys)."""
        import datetime as _dt

        taken = _dt.datetime.fromtimestamp(self.time, _dt.timezone.utc).replace(microsecond=0)
        return {
            "taken": taken.isoformat(),
            "driver_version": self.driver_version,
            "gpus": [{"index": g.index, "name": g.name, "memory_used_bytes": g.memory_used,
                      "memory_total_bytes": g.memory_total, "utilization_percent": g.util_gpu,
                      "temperature_c": g.temperature_c, "status": g.status} for g in self.gpus],
            "processes": [{"gpu": p.gpu_index, "pid": p.pid, "command": p.command, "used_bytes": p.used_bytes}
                          for g in self.gpus for p in g.processes],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "driver_version": self.driver_version,
            "error": self.error,
            "gpus": [g.to_json() for g in self.gpus],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Snapshot:
        kw = checked_fields(cls, d, skip=("gpus",))
        return cls(**{**kw, "time": float(kw["time"])},
                   gpus=tuple(GpuSnapshot.from_json(g) for g in _listed(d, "gpus")))


def _listed(d: dict[str, Any], key: str) -> list[Any] | tuple[Any, ...]:
    """A recorded list (absent or null: empty); ValueError when it is anything else."""
    v = d.get(key)
    if v is None:
        return []
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"'{key}' is {type(v).__name__}, not a list")
    return v
