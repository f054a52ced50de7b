"""The fleet panel on the offscreen platform, reading a real Prometheus (loopback, 1 s scrapes) that scrapes a
dcgm-exporter text exporter for three hosts: grid and table, sort and filter, alerts, a GPU's history on a click,
the Add Prometheus server… dialog and the states of bad servers."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings, Qt  # noqa: E402

from engine.core.units import GIB, MIB  # noqa: E402
from engine.monitor.promapi import Credentials, PromClient  # noqa: E402
from engine.monitor.prometheus import PrometheusSource  # noqa: E402
from gui.monitor.fleet import MEMORY_PCT_COLUMN  # noqa: E402
from gui.monitor.fleet_panel import FleetPanel, panel_for  # noqa: E402
from gui.monitor.prometheus_dialog import AUTH_BASIC, KEY_URL, KEY_USER, PrometheusDialog  # noqa: E402
from tests.promserver import PrometheusServer, TextExporter, dcgm_text, ensure_prometheus, free_port  # noqa: E402
from tests.test_monitor_prometheus import fleet_gpus  # noqa: E402


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    path, why = ensure_prometheus()
    if path is None:
        pytest.skip(why)
    dcgm = TextExporter(dcgm_text(fleet_gpus()))
    server = None
    try:
        server = PrometheusServer(path, tmp_path_factory.mktemp("prom"), {"dcgm": [dcgm.target]})
        server.wait_series("DCGM_FI_DEV_FB_USED", 14)
        yield server
    finally:
        if server is not None:
            server.close()
        dcgm.close()


@pytest.fixture
def make_panel(qtbot):
    made: list[FleetPanel] = []

    def make(url, **kw):
        p = panel_for(url, **kw)
        qtbot.addWidget(p)
        p.resize(1300, 800)
        p.show()
        made.append(p)
        return p

    yield make
    for p in made:
        p.shutdown()


def _row_of(panel, host, gpu):
    for r in range(panel.model.rowCount()):
        if panel.model.index(r, 0).data() == host and panel.model.index(r, 1).data() == str(gpu):
            return r
    raise AssertionError(f"{host} GPU {gpu} not in the table")


def test_grid_table_sort_filter_and_alerts(make_panel, qtbot, prom):
    p = make_panel(prom.url, autostart=False)
    p.sample_now()
    assert p.model.total == 14 and p.grid.hosts == ["gpu-node-a", "gpu-node-b", "gpu-node-c"]
    assert len(p.grid.cells) == 14 and p.grid.columns == 8
    assert "14 GPUs on 3 hosts" in p.status_text
    # sorted by memory use, fullest first: gpu-node-c GPU 0 holds 80000 of 81559 MiB
    assert (p.model.index(0, 0).data(), p.model.index(0, 1).data()) == ("gpu-node-c", "0")
    assert p.model.index(0, MEMORY_PCT_COLUMN).data() == "98%"
    # what is painted: the memory cell of that row tinted as an alert, the host cell beside it not
    image = p.table.viewport().grab().toImage()
    mem_rect = p.table.visualRect(p.model.index(0, 3))
    ratio = image.devicePixelRatio()
    mem_px = image.pixelColor(int((mem_rect.left() + 3) * ratio), int((mem_rect.bottom() - 3) * ratio))
    assert mem_px.name() == "#f8d4d4"
    tints = {"#dff3e4", "#fdecc8", "#f8d4d4", "#eeeeee"}
    for r in range(p.model.rowCount()):  # no host cell takes the tint of a cell painted before it
        host_rect = p.table.visualRect(p.model.index(r, 0))
        if host_rect.bottom() < p.table.viewport().height():
            px = image.pixelColor(int((host_rect.right() - 3) * ratio), int((host_rect.bottom() - 3) * ratio))
            assert px.name() not in tints, (r, px.name())
    r = _row_of(p, "gpu-node-a", 5)
    assert p.model.index(r, 8).data() == "research/llm-train-1/trainer"
    # click the header: ascending by host
    header = p.table.horizontalHeader()
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton, pos=_header_point(header, 0))
    assert p.model.index(0, 0).data() == "gpu-node-a"
    # filter by pod name, then by memory use
    qtbot.keyClicks(p.filter_edit, "llm-train-1")
    assert p.model.rowCount() == 4 and p.count_label.text() == "4 of 14 GPUs"
    p.filter_edit.clear()
    p.min_memory_spin.setValue(50)
    assert p.model.rowCount() == 1
    p.min_memory_spin.setValue(0)
    kinds = {(a.kind, a.message.split(" (")[0]) for a in p.alert_log}
    assert {("memory", "gpu-node-c GPU 0"), ("xid", "gpu-node-c GPU 1")} <= kinds
    assert p.alert_list.count() == len(p.alert_log)
    status = p.model.index(_row_of(p, "gpu-node-c", 1), 9).data()
    assert status == "xid"


def _header_point(header, section):
    from PySide6.QtCore import QPoint

    return QPoint(header.sectionViewportPosition(section) + header.sectionSize(section) // 2, header.height() // 2)


def test_clicking_a_gpu_opens_its_history(make_panel, qtbot, prom):
    p = make_panel(prom.url, autostart=False)
    p.sample_now()
    r = _row_of(p, "gpu-node-a", 3)
    idx = p.model.index(r, 0)
    rect = p.table.visualRect(idx)
    qtbot.mouseClick(p.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    dlg = p.history_dialog
    assert dlg is not None and dlg.gpu.host == "gpu-node-a" and dlg.gpu.host_gpu == 3
    qtbot.waitUntil(lambda: bool(dlg.snapshots) or "Could not" in dlg.status.text(), timeout=15000)
    _x, y = dlg.plots.curve_data("memory", dlg.gpu.index)
    assert len(y) >= 1 and all(v == pytest.approx(4000 * MIB / GIB) for v in y)  # the exporter's 4000 MiB
    # the grid: a click on gpu-node-c GPU 1's cell opens that GPU
    g = next(g for g in p.grid.cells.values() if g.host == "gpu-node-c" and g.host_gpu == 1)
    qtbot.mouseClick(p.grid, Qt.MouseButton.LeftButton, pos=p.grid.cell_rect(g.index).center().toPoint())
    assert p.history_dialog is not dlg and p.history_dialog.gpu.index == g.index


def test_unreachable_server_shows_a_state_and_keeps_asking(make_panel, qtbot):
    p = make_panel(f"http://127.0.0.1:{free_port()}", interval=1.0, refresh_ms=50)
    qtbot.waitUntil(lambda: "cannot connect" in p.status_text, timeout=10000)
    assert p.sampler.running and p.model.rowCount() == 0


class _Stall(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        time.sleep(3)

    def log_message(self, *args) -> None:
        pass


def test_a_stalled_server_times_out_without_freezing_the_panel(qtbot):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Stall)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    p = FleetPanel(PrometheusSource(PromClient(f"http://127.0.0.1:{httpd.server_address[1]}", timeout=0.5)),
                   interval=1.0, refresh_ms=50)
    qtbot.addWidget(p)
    try:
        ticks = []
        qtbot.waitUntil(lambda: ticks.append(1) is None and "no answer within 0.5 s" in p.status_text,
                        timeout=10000)
        assert len(ticks) > 1  # the GUI thread kept running while the query hung
    finally:
        p.shutdown()
        httpd.shutdown()
        httpd.server_close()
        t.join(5)


def test_add_server_dialog_keeps_secrets_out_of_settings(qtbot, tmp_path):
    ini = tmp_path / "settings.ini"
    settings = QSettings(str(ini), QSettings.Format.IniFormat)
    dlg = PrometheusDialog(settings)
    qtbot.addWidget(dlg)
    dlg.show()
    qtbot.keyClicks(dlg.url_edit, "not a url://")  # spaces: refused before its scheme is read
    dlg.accept()
    assert dlg.error_label.isVisible() and "holds a space or a control character" in dlg.error_label.text()
    dlg.url_edit.clear()
    qtbot.keyClicks(dlg.url_edit, "ftp://prom.example:9090/")
    dlg.accept()
    assert dlg.error_label.isVisible() and "not an http(s) address" in dlg.error_label.text()
    dlg.url_edit.clear()
    qtbot.keyClicks(dlg.url_edit, "http://prom.example:9090/")
    dlg.auth_combo.setCurrentIndex(dlg.auth_combo.findData(AUTH_BASIC))
    assert dlg.password_edit.isVisible() and not dlg.token_edit.isVisible()
    qtbot.keyClicks(dlg.user_edit, "alice")
    qtbot.keyClicks(dlg.password_edit, "hunter2-secret")
    qtbot.keyClick(dlg.password_edit, Qt.Key.Key_Return)
    assert dlg.result() == dlg.DialogCode.Accepted
    assert dlg.client is not None and dlg.client.url == "http://prom.example:9090"
    assert dlg.client.credentials == Credentials(user="alice", password="hunter2-secret")
    settings.sync()
    assert settings.value(KEY_URL) == "http://prom.example:9090" and settings.value(KEY_USER) == "alice"
    assert "hunter2-secret" not in ini.read_text()
    again = PrometheusDialog(settings)
    qtbot.addWidget(again)
    assert again.url_edit.text() == "http://prom.example:9090" and again.password_edit.text() == ""


def test_main_window_monitor_menu_adds_a_fleet_tab(qtbot, tmp_path, prom, monkeypatch):
    from gui import main_window
    from gui.monitor import fleet_panel

    w = main_window.MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat), restore_state=False,
                               engine_processes=False)
    w.confirm_close = False
    qtbot.addWidget(w)
    menu = next(a.menu() for a in w.menuBar().actions() if a.text() == "&Monitor")
    action = next(a for a in menu.actions() if a.text() == "Add &Prometheus server…")
    monkeypatch.setattr(fleet_panel, "ask_for_server",
                        lambda settings, parent=None: panel_for(prom.url, autostart=False))
    action.trigger()
    panel = w.tabs.fleet_panels[0]
    assert w.tabs.currentWidget() is panel and w.tabs.tabText(w.tabs.currentIndex()).startswith("Fleet · 127.0.0.1:")
    qtbot.mouseClick(panel.close_button, Qt.MouseButton.LeftButton)
    assert w.tabs.fleet_panels == [] and w.tabs.indexOf(panel) == -1
    w.close()


def test_selection_follows_its_gpu_when_the_order_changes(make_panel, qtbot, prom):
    p = make_panel(prom.url, autostart=False)
    p.sample_now()
    r = _row_of(p, "gpu-node-b", 2)
    cell = p.table.visualRect(p.model.index(r, 0)).center()
    qtbot.mouseClick(p.table.viewport(), Qt.MouseButton.LeftButton, pos=cell)
    if p.history_dialog is not None:
        p.history_dialog.close()
    qtbot.keyClicks(p.filter_edit, "gpu-node-b")  # the rows move; the selected GPU stays selected
    (sel,) = p.table.selectionModel().selectedRows()
    assert p.model.gpu_at(sel.row()).host == "gpu-node-b" and p.model.gpu_at(sel.row()).host_gpu == 2
    assert p.model.rowCount() == 4
