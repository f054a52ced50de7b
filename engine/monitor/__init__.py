"""Live GPU monitor: NVML sampling into immutable snapshots, history, alerts, recording and replay (no Qt)."""

from ..core.nvml import NotAvailable
from .alerts import Alert, AlertMonitor, Thresholds, is_leak
from .nvml import NvmlSource, snapshot_once
from .recording import Recorder, ReplaySource, load_recording, save_recording
from .ringbuffer import RingBuffer
from .sampler import DEFAULT_INTERVAL_S, MIN_INTERVAL_S, Sampler
from .samples import GPU_ERROR, GPU_LOST, GPU_OK, GpuSnapshot, MigDeviceInfo, ProcessInfo, Snapshot

__all__ = [
    "Alert", "AlertMonitor", "Thresholds", "is_leak",
    "NotAvailable", "NvmlSource", "snapshot_once",
    "Recorder", "ReplaySource", "load_recording", "save_recording",
    "RingBuffer", "Sampler", "DEFAULT_INTERVAL_S", "MIN_INTERVAL_S",
    "GPU_OK", "GPU_LOST", "GPU_ERROR", "GpuSnapshot", "MigDeviceInfo", "ProcessInfo", "Snapshot",
]
