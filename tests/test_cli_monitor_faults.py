"""Issue 12: monitor faults. Every NVML failure (any exception type, a lost GPU while counting, a hung call) is a
state in the snapshot, never a traceback; a full disk ends a recording with one line and the samples so far in
place; SIGTERM finishes the recording's file."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import cli.monitor as cli_monitor
from engine.core.errors import UserError
from engine.monitor.nvml import NvmlSource
from engine.monitor.recording import Recorder, load_recording
from engine.monitor.sampler import Sampler
from engine.monitor.samples import GPU_ERROR, GPU_OK
from main import main
from tests.fake_nvml import E, FakeNvml, fake_details, three_gpus

ROOT = Path(__file__).resolve().parent.parent


def _raise(exc):
    def fn(*a, **k):
        raise exc
    return fn


FAULTS = [
    ("nvmlDeviceGetCount", E.NVMLError_GpuIsLost()),
    ("nvmlDeviceGetCount", OSError(5, "Input/output error")),
    ("nvmlDeviceGetCount", ValueError("bad count")),
    ("nvmlDeviceGetHandleByIndex", OSError(5, "Input/output error")),
    ("nvmlDeviceGetHandleByIndex", RuntimeError("ctypes said no")),
    ("nvmlDeviceGetUtilizationRates", OSError(5, "Input/output error")),
    ("nvmlDeviceGetUtilizationRates", AttributeError("no gpu")),
    ("nvmlDeviceGetMemoryInfo", TypeError("bad struct")),
    ("nvmlDeviceGetName", UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")),
    ("nvmlDeviceGetTemperature", ZeroDivisionError("division by zero")),
    ("nvmlDeviceGetPowerUsage", KeyError("power")),
    ("nvmlDeviceGetComputeRunningProcesses_v3", MemoryError()),
    ("nvmlSystemGetDriverVersion", OSError(5, "Input/output error")),
]


@pytest.mark.parametrize("fn, exc", FAULTS, ids=[f"{f}-{type(e).__name__}" for f, e in FAULTS])
def test_no_fault_escapes_sample(fn, exc):
    fake = FakeNvml(three_gpus())
    setattr(fake, fn, _raise(exc))
    src = NvmlSource(fake, process_details=fake_details)
    snap = src.sample()  # never raises
    if fn == "nvmlDeviceGetCount":
        assert snap.error and not snap.gpus
    elif fn == "nvmlDeviceGetHandleByIndex":
        assert all(g.status == GPU_ERROR and g.error for g in snap.gpus)
    else:
        assert snap.gpus and all(g.status == GPU_OK for g in snap.gpus)
    setattr(fake, fn, getattr(FakeNvml, fn).__get__(fake))
    assert all(g.status == GPU_OK for g in src.sample().gpus)  # the next sample recovers


def test_an_oserror_from_one_metric_leaves_the_rest(fake_cli, capsys):
    fake_cli.nvmlDeviceGetUtilizationRates = _raise(OSError(5, "Input/output error"))
    assert main(["monitor", "--once"]) == 0
    out, err = capsys.readouterr()
    assert "NVIDIA A100-SXM4-80GB" in out and "29.30 GiB" in out and "Traceback" not in err


def test_gpu_lost_while_counting_is_a_state_in_monitor(fake_cli, capsys):
    fake_cli.nvmlDeviceGetCount = _raise(E.NVMLError_GpuIsLost())
    assert main(["monitor", "--once", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "GPU is lost" in out and "Traceback" not in err


def test_a_hung_call_times_out_and_stop_returns():
    fake = FakeNvml(three_gpus())
    release = threading.Event()

    def hangs(h):
        release.wait(60)
        raise E.NVMLError_Unknown()

    fake.nvmlDeviceGetPowerUsage = hangs
    src = NvmlSource(fake, process_details=fake_details, call_timeout=0.3)
    snap = src.sample()
    g0, *others = snap.gpus
    assert "timed out" in g0.why_unavailable("power_mw") and g0.memory_total is not None  # earlier calls answered
    # one timeout, then every later call fails at once while the hung one is stuck ("has not answered for": the
    # refusal made without queueing; a call that waited its timeout says "did not answer within")
    assert others and all(g.status == GPU_ERROR and "has not answered" in g.error for g in others)
    assert not any("did not answer within" in g.error for g in others)
    sampler = Sampler(src, interval=0.1)
    sampler.start()
    time.sleep(0.3)
    sampler.stop(timeout=5)
    assert not sampler.running
    release.set()


@pytest.fixture
def fake_cli(monkeypatch):
    f = FakeNvml(three_gpus())
    monkeypatch.setattr(cli_monitor, "NvmlSource", lambda: NvmlSource(f, process_details=fake_details))
    monkeypatch.setattr(cli_monitor.time, "sleep", lambda s: None)
    return f


class FullDisk:
    """A file object whose writes fail with ENOSPC after `room` bytes, as a full disk does."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def write(self, text):
        if self.room - len(text) < 0:
            self.f.write(text[: max(self.room, 0)])  # a torn line, as a real full disk leaves
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(text)
        return self.f.write(text)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_a_full_disk_ends_the_recording_with_one_line_and_keeps_the_samples(fake_cli, capsys, tmp_path,
                                                                             monkeypatch):
    path = tmp_path / "rec.jsonl"
    real_init = Recorder.__init__

    def init(self, p, fmt=None):
        real_init(self, p, fmt)
        self._f = FullDisk(self._f, 30_000)

    monkeypatch.setattr(Recorder, "__init__", init)
    rc = main(["monitor", "--jsonl", str(path), "--interval", "0.1", "--duration", "100", "--json"])
    _out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "the disk is full" in lines[0] and "Traceback" not in err
    kept = load_recording(path)  # whole samples only: the torn line is gone
    assert kept and f"the {len(kept)} samples before it" in lines[0]
    assert not (tmp_path / "rec.jsonl.part").exists()


def test_a_full_disk_before_any_sample_leaves_no_file(tmp_path):
    r = Recorder(tmp_path / "rec.jsonl")
    r._f = FullDisk(r._f, 0)
    from engine.monitor.samples import Snapshot

    with pytest.raises(UserError, match="nothing was recorded"):
        r.write(Snapshot(time=1.0, error="x"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM")
def test_sigterm_finishes_the_recording(tmp_path):
    path = tmp_path / "rec.csv"
    code = ("import sys; sys.argv=['x']; from tests.fake_nvml import FakeNvml, fake_details, three_gpus\n"
            "import cli.monitor as m; from engine.monitor.nvml import NvmlSource\n"
            "f = FakeNvml(three_gpus()); m.NvmlSource = lambda: NvmlSource(f, process_details=fake_details)\n"
            f"from main import main; sys.exit(main(['monitor', '--csv', {str(path)!r}, '--interval', '0.1']))\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    part = tmp_path / "rec.csv.part"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (part.exists() and part.stat().st_size > 2000):
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "Traceback" not in err and "recorded" in err
    assert path.exists() and not part.exists() and load_recording(path)


def test_monitor_refuses_empty_recording_names(capsys):
    assert main(["monitor", "--once", "--csv", ""]) == 2
    assert "--csv: is an empty file name" in capsys.readouterr().err
