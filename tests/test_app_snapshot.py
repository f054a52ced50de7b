"""File ▸ Open memory snapshot… in the app: read off the GUI thread with progress, shown alone or beside the
current estimate (timeline overlay, Measured tab), a bad file a message that keeps the user's work."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt, QTimer  # noqa: E402
from PySide6.QtWidgets import QFileDialog  # noqa: E402

from benchmarks.snapshot_synth import make_snapshot, write  # noqa: E402
from engine.snapshot import open_snapshot  # noqa: E402
from tests.app_windows import open_window  # noqa: E402

DATA = Path(__file__).parent / "data"
OOM = DATA / "resnet50-b256-oom-at-4gib.pickle.gz"
RESNET18 = DATA / "resnet18-b8-adam.pickle.gz"


@pytest.fixture
def window(qtbot, tmp_path):
    w = open_window(qtbot, tmp_path)
    yield w
    w.close()


def _choose(monkeypatch, path: Path) -> list[str]:
    asked: list[str] = []

    def fake(parent, caption, directory="", filters=""):
        asked.append(filters)
        return str(path), filters

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(fake))
    return asked


def _is_snapshot(kind, jid, value) -> bool:
    return kind == "snapshot"


def test_shortcut_opens_an_oom_snapshot_alone(qtbot, window, monkeypatch, tmp_path):
    asked = _choose(monkeypatch, OOM)
    with qtbot.waitSignal(window.bridge.result, timeout=120000, check_params_cb=_is_snapshot) as blocker:
        qtbot.keyClick(window, Qt.Key.Key_O, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert asked and "*.pickle.gz" in asked[0]
    snap = blocker.args[2]
    assert window.measured is snap and snap.source == "snapshot"
    # no estimate open: every view shows the run; the Measured tab shows its figures with nothing to compare
    assert window.results.estimate is snap
    assert window.results.tabs.currentWidget() is window.results.compare
    text = window.results.compare.message.text()
    assert "out of memory" in text and "784.00 MiB" in text and "Open the model that ran" in text
    rows = {r[0].strip(): r for r in window.results.compare.rows()}
    assert rows["Peak allocated"][1:3] == (None, snap.peak_bytes)
    assert "784.00 MiB" in window.statusBar().currentMessage()
    assert any(" › " in r.name for r in snap.per_module)  # modules named from the frames' call sites
    # the report exports the run's findings like any estimate's
    pdf = tmp_path / "oom.pdf"
    with qtbot.waitSignal(window.bridge.result, timeout=120000, check_params_cb=lambda k, j, v: k == "report"):
        window.export_report(str(pdf))
    assert pdf.stat().st_size > 10_000 and "Report written" in window.statusBar().currentMessage()


def test_snapshot_beside_the_estimate_of_its_model(qtbot, window, monkeypatch):
    with qtbot.waitSignal(window.estimateReady, timeout=120000) as est_blocker:
        assert window.open_model("resnet18")
    est = est_blocker.args[0]
    _choose(monkeypatch, RESNET18)
    with qtbot.waitSignal(window.bridge.result, timeout=120000, check_params_cb=_is_snapshot):
        window.act_open_snapshot.trigger()
    snap = open_snapshot(RESNET18)
    assert window.results.estimate is est  # the estimate stays the main view
    assert window.results.timeline._measured.peak_bytes == snap.peak_bytes  # overlaid on its timeline
    rows = {r[0].strip(): r for r in window.results.compare.rows()}
    name, e, m, err = rows["Peak allocated"]
    assert (e, m) == (est.peak_bytes, snap.peak_bytes) and err == pytest.approx((e - m) / m)
    assert "Real run (resnet18-b8-adam.pickle.gz)" in window.results.compare.message.text()
    # a new estimate of the model (another batch) keeps the real run beside it
    with qtbot.waitSignal(window.estimateReady, timeout=120000):
        window.config_panel.batch.setValue(8)
        window.config_panel.flush()
    assert window.measured.source == "snapshot"
    assert window.results.compare.rows()[0][2] == snap.peak_bytes


def test_a_hostile_file_is_a_message_and_the_work_stays(qtbot, window, monkeypatch, tmp_path):
    import gzip
    import os
    import pickle

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    evil = tmp_path / "evil.pickle.gz"
    evil.write_bytes(gzip.compress(pickle.dumps({"segments": [], "device_traces": [[Boom()]]})))
    _choose(monkeypatch, evil)
    with qtbot.waitSignal(window.bridge.error, timeout=60000, check_params_cb=lambda k, j, m: k == "snapshot"):
        window.open_snapshot_dialog()
    assert not (tmp_path / "ran").exists()
    assert "refused without running it" in window.results.compare.message.text()
    assert window.measured is None and not window.results.compare.progress.isVisible()


def test_a_long_snapshot_reads_in_the_worker_process_with_progress(qtbot, tmp_path):
    # The app's own set-up: snapshots are read in an engine process; the GUI thread keeps handling events and
    # shows the reader's progress meanwhile.
    w = open_window(qtbot, tmp_path, processes=True)
    try:
        path = write(tmp_path / "long.pickle.gz", make_snapshot(300_000, layers=128)[0])
        fractions: list[float] = []
        w.bridge.progress.connect(lambda kind, jid, f, msg: fractions.append(f) if kind == "snapshot" else None)
        ticks = []
        timer = QTimer()
        timer.timeout.connect(lambda: ticks.append(len(fractions)))
        timer.start(20)
        with qtbot.waitSignal(w.bridge.result, timeout=300000, check_params_cb=_is_snapshot) as blocker:
            w.open_snapshot(str(path))
            assert w.results.compare.progress.isVisible() and w.act_stop.isEnabled()
        timer.stop()
        assert blocker.args[2].extra["snapshot"]["events"] >= 300_000
        assert len([f for f in fractions if 0 < f < 1]) >= 5 and fractions == sorted(fractions)
        # the event loop ran between progress reports, not only after the job
        assert len({t for t in ticks if 0 < t < len(fractions)}) >= 3
        assert not w.results.compare.progress.isVisible()
    finally:
        w.close()


def test_what_would_have_fit_in_the_plan_tab(qtbot, window, monkeypatch):
    # The H200 run of ResNet-18 at batch 512 under a 2 GiB cap (tests/data; benchmarks/snapshot_gpu_check.py):
    # with ResNet-18 open at batch 32, the planner answers over the memory that run held when it failed.
    with qtbot.waitSignal(window.estimateReady, timeout=120000):
        assert window.open_model("resnet18")
    _choose(monkeypatch, DATA / "resnet18-b512-oom-at-2gib.pickle.gz")
    snap = open_snapshot(DATA / "resnet18-b512-oom-at-2gib.pickle.gz")
    budget = snap.extra["oom_detail"]["reserved_bytes"]
    window.act_open_snapshot.trigger()
    label = window.results.plan.real_run
    qtbot.waitUntil(lambda: "largest batch that fits" in label.text(), timeout=300000)
    assert not label.isHidden() and "What would have fit" in label.text()
    from engine.units import format_bytes

    assert format_bytes(budget) in label.text() and "(was 32)" in label.text()
