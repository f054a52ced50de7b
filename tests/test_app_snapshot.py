"""File ▸ Open memory snapshot… in the app: read off the GUI thread with progress, shown alone or beside the
current estimate (timeline overlay, Measured tab), a bad file a message that keeps the user's work."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt, QTimer  # noqa: E402
from PySide6.QtWidgets import QFileDialog  # noqa: E402

from benchmarks.snapshot_synth import make_snapshot, write  # noqa: E402
from engine.snapshots.reader import open_snapshot  # noqa: E402
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
    assert window.snapshots.snap is snap and snap.source == "snapshot"
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


def _is_beside(kind, jid, value) -> bool:
    return kind == "beside"


def test_snapshot_beside_its_model_is_compared_in_the_configuration_it_shows(qtbot, window, monkeypatch):
    # ResNet-18 open with leftover settings (batch 16, bf16 mixed precision, SGD): the b8 Adam fp32 run is compared
    # with the estimate of its own step, as `vramscope open --model resnet18` does, not with the panel's (the
    # panel's gave "Inputs −50.9 %").
    with qtbot.waitSignal(window.estimateReady, timeout=120000):
        assert window.open_model("resnet18")
    panel = window.config_panel
    with qtbot.waitSignal(window.estimateReady, timeout=120000) as est_blocker:
        panel.batch.setValue(16)
        panel.precision.setCurrentIndex(panel.precision.findData("amp-bf16"))
        panel.optimizer.setCurrentIndex(panel.optimizer.findData("sgd"))
        panel.flush()
    est = est_blocker.args[0]
    assert (est.config.batch_size, est.config.precision, est.config.optimizer) == (16, "amp-bf16", "sgd")
    _choose(monkeypatch, RESNET18)
    with qtbot.waitSignal(window.bridge.result, timeout=120000, check_params_cb=_is_beside) as blocker:
        qtbot.keyClick(window, Qt.Key.Key_O, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    found = blocker.args[2]
    from engine.models.sources import resolve_source
    from engine.planning.snapshot_fit import beside

    cli = beside(open_snapshot(RESNET18), resolve_source("resnet18"))  # what the CLI's open --model shows
    assert (found.config.batch_size, found.config.precision, found.config.optimizer) == (8, "fp32", "adam")
    assert [r[1:] for r in found.comparison.rows] == [r[1:] for r in cli.comparison.rows]
    assert window.results.estimate is est  # the panel's estimate stays the main view
    view = window.results.compare.rows()
    assert [(e, m) for _n, e, m, _err in view] == [(e, m) for _n, e, m, _err in cli.comparison.rows]
    assert [err for *_x, err in view] == pytest.approx([r[3] / 100 for r in cli.comparison.rows])
    rows = {r[0].strip(): r for r in view}
    assert rows["Inputs at peak"][3] == 0 and rows["Parameters at peak"][3] == 0  # the run's own batch, its dtype
    cells = [window.results.compare.table.item(r, 3).text() for r in range(window.results.compare.table.rowCount())]
    assert "+0.0 %" in cells and "-50.9 %" not in cells
    text = window.results.compare.message.text()
    assert "Real run (resnet18-b8-adam.pickle.gz)" in text and "batch 8, fp32, adam" in text
    assert "batch size 8 read from the snapshot's input bytes" in text and "not the model" not in text
    assert window.results.timeline._measured.peak_bytes == found.snapshot.peak_bytes  # overlaid on its timeline
    # another batch in the panel: a new estimate, the same comparison of the run's own step
    with qtbot.waitSignal(window.estimateReady, timeout=120000):
        panel.batch.setValue(24)
        panel.flush()
    assert window.snapshots.found is found and window.results.compare.rows()[0][1:3] == cli.comparison.rows[0][1:3]


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
    assert window.snapshots.snap is None and not window.results.compare.progress.isVisible()


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
        assert blocker.args[2].snapshot.events >= 300_000
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
    budget = snap.oom.reserved_bytes
    window.act_open_snapshot.trigger()
    label = window.results.plan.real_run
    qtbot.waitUntil(lambda: "largest batch that fits" in label.text(), timeout=300000)
    assert not label.isHidden() and "What would have fit" in label.text()
    from engine.core.units import format_bytes

    # planned for the run's own step (batch 512, read from its inputs), not the panel's batch 32
    assert format_bytes(budget) in label.text() and "(was 512)" in label.text()
