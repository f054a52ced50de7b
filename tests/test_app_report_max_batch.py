"""A report with the full plan (File ▸ Export report with full plan…), asked for while the planner works, waits for
all of its answers: the largest batch that fits as well as the plan (on threads the plan may come first; the report
said 'not computed' for the batch the Plan tab showed). The plain export does not wait: tests/test_exports_plan.py."""

from __future__ import annotations

import re
import threading

import pytest

pytest.importorskip("pytestqt")
pypdf = pytest.importorskip("pypdf")

from engine.core.errors import Cancelled  # noqa: E402
from engine.jobs import calls as jobs  # noqa: E402
from tests.app_windows import open_window  # noqa: E402


def test_the_report_waits_for_the_largest_batch_and_states_it(qtbot, tmp_path, monkeypatch):
    release = threading.Event()
    search = jobs.max_batch

    def slow_search(*args, cancel=None, progress=None):  # the search still running when the plan has answered
        while not release.wait(0.02):
            if cancel is not None and cancel.is_set():
                raise Cancelled()
        return search(*args, cancel=cancel, progress=progress)

    monkeypatch.setattr(jobs, "max_batch", slow_search)
    window = open_window(qtbot, tmp_path)  # the engine on threads: each job kind on its own
    window.auto_plan = True
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        assert window.open_template("mlp")
    out = tmp_path / "mlp.pdf"
    assert window.export_report(str(out), full=True) == 0  # waits for the planner
    qtbot.waitUntil(lambda: window.recommendations is not None, timeout=120000)
    assert not out.exists() and window.max_batch is None  # the plan came; the report still waits
    with qtbot.waitSignal(window.bridge.result, timeout=120000,
                          check_params_cb=lambda kind, _jid, _value: kind == "report"):
        release.set()
    shown = window.max_batch
    assert shown is not None and shown.batch_size > 1
    assert f"{shown.batch_size:,}" in window.results.plan.max_batch.text()
    text = re.sub(r"\s+", " ", " ".join(p.extract_text() for p in pypdf.PdfReader(str(out)).pages))
    assert f"Largest batch that fits {shown.batch_size}" in text
    assert "not computed" not in text
    window.close()
