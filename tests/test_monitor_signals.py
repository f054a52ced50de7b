"""Issue 27 item 9: SIGTERM or Ctrl+C ends a watch (monitor, --serve-metrics) whatever code it lands in. The signal
is sent on cue from inside a stand-in NVML call, while the main thread provably waits in NvmlSource.query under its
broad `except Exception` (where a termination exception was swallowed and the loop ran on)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

import cli.monitor as cli_monitor
from engine.monitor.nvml import NvmlSource
from engine.monitor.recording import load_recording
from main import main
from tests.fake_nvml import FakeNvml, fake_details, three_gpus

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="signals sent to a thread")


def _main_thread_functions() -> list[str]:
    frame: FrameType | None = sys._current_frames()[threading.main_thread().ident or 0]
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names


class SignalOnCue(FakeNvml):
    """The `at`-th call of `fn` (on the NVML thread) first checks that the main thread waits inside
    NvmlSource.query (or its init), then sends `sig` to the main thread, then returns or raises as `then` says:
    the signal is pending on the main thread before the call returns, so its handler runs inside that wait."""

    def __init__(self, fn: str, at: int, sig: int, then: BaseException | None = None):
        super().__init__(three_gpus())
        self.cue, self.at, self.sig, self.then = fn, at, sig, then
        self.seen = 0
        self.landed_in: list[str] = []
        real = getattr(self, fn)

        def on_cue(*args: object) -> object:
            self.seen += 1
            if self.seen == self.at:
                self.landed_in = _main_thread_functions()
                signal.pthread_kill(threading.main_thread().ident or 0, self.sig)
                if self.then is not None:
                    raise self.then
            return real(*args)

        setattr(self, fn, on_cue)


@contextmanager
def _signals_caught() -> Iterator[list[int]]:
    """A signal that reaches no watch's handler is counted here instead of ending the test run."""
    caught: list[int] = []

    def note(signum: int, _frame: object) -> None:
        caught.append(signum)

    old = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield caught
    finally:
        for s, h in old.items():
            signal.signal(s, h)


LANDINGS = [  # the NVML call the signal is sent from, on its n-th call; what it does then; where main waits; samples
    ("nvmlDeviceGetUtilizationRates", 7, None, "query", 3),  # the third sample's first GPU, answering
    ("nvmlDeviceGetUtilizationRates", 7, OSError(5, "Input/output error"), "query", 3),  # … failing
    ("nvmlDeviceGetCount", 2, None, "query", 2),  # counting the GPUs of the second sample
    ("nvmlInit", 1, None, "_try_init", 1),  # starting NVML, in the first sample
]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("fn, at, then, inside, expected", LANDINGS,
                         ids=[f"{f}-{type(t).__name__}" for f, _, t, _, _ in LANDINGS])
def test_a_signal_inside_an_nvml_call_ends_the_watch_after_that_sample(sig, fn, at, then, inside, expected, tmp_path,
                                                                       monkeypatch, capsys):
    fake = SignalOnCue(fn, at, sig, then)
    monkeypatch.setattr(cli_monitor, "NvmlSource", lambda: NvmlSource(fake, process_details=fake_details))
    path = tmp_path / "rec.jsonl"
    with _signals_caught() as stray:
        # --duration only bounds a watch that runs on past the signal (the fault): it never ends a passing run
        rc = main(["monitor", "--jsonl", str(path), "--interval", "0.1", "--duration", "20", "--json"])
    err = capsys.readouterr().err
    assert inside in fake.landed_in and "call" in fake.landed_in  # main waited for this very call
    assert rc == 0 and stray == [] and "Traceback" not in err
    samples = load_recording(path)
    # the sample the signal came in is whole and recorded (the call answered as it would have), and none after it
    assert len(samples) == expected and all(len(s.gpus) == 3 and not s.error for s in samples)
    assert f"recorded {expected} samples to {path}" in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_exporters_first_sample_ends_it_normally(sig, monkeypatch, capsys):
    """The exporter's first sample runs before it says "serving…": a signal there reaches its handler (it was sent
    before any was installed, and killed the process) and ends it once it is up."""
    pytest.importorskip("prometheus_client")
    import cli.fleet as cli_fleet

    fake = SignalOnCue("nvmlDeviceGetUtilizationRates", 1, sig)
    closed: list[bool] = []

    def source() -> NvmlSource:
        src = NvmlSource(fake, process_details=fake_details)
        real_close = src.close
        src.close = lambda: (closed.append(True), real_close())[1]
        return src

    monkeypatch.setattr(cli_fleet, "NvmlSource", source)
    with _signals_caught() as stray:
        # --duration only bounds an exporter that runs on past the signal (the fault)
        rc = main(["monitor", "--serve-metrics", "127.0.0.1:0", "--interval", "0.1", "--duration", "20"])
    err = capsys.readouterr().err
    assert "query" in fake.landed_in and "__init__" in fake.landed_in  # inside MetricsServer(), before "serving"
    assert rc == 0 and stray == [] and "Traceback" not in err
    assert "serving this machine's GPUs at http://127.0.0.1:" in err and closed == [True]


def test_a_signal_between_samples_ends_the_wait_at_once(tmp_path, monkeypatch, capsys):
    """SIGTERM while the watch waits out a one-hour interval after its first sample (sent from another thread once
    the main thread is past the sample, in or just before its wait): the watch ends at once, one sample kept."""
    fake = FakeNvml(three_gpus())
    monkeypatch.setattr(cli_monitor, "NvmlSource", lambda: NvmlSource(fake, process_details=fake_details))
    sent = threading.Event()

    def send_once_waiting() -> None:
        for _ in range(6000):  # polls where the main thread is (at most a minute); the outcome does not depend on it
            stack = _main_thread_functions()
            if "watch" in stack and "sample" not in stack and "write" not in stack and "show" not in stack:
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
                sent.set()
                return
            threading.Event().wait(0.01)

    path = tmp_path / "rec.csv"
    sender = threading.Thread(target=send_once_waiting)
    with _signals_caught() as stray:
        sender.start()
        rc = main(["monitor", "--csv", str(path), "--interval", "3600"])
    sender.join()
    assert sent.is_set() and rc == 0 and stray == [] and len(load_recording(path)) == 1
    assert f"recorded 1 samples to {path}" in capsys.readouterr().err
