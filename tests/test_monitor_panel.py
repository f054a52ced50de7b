"""The monitor panel on the offscreen platform: no-driver message, replay of a recorded session, overlay, alerts,
live sampling + recording from the NVML stand-in, clean shutdown."""

from __future__ import annotations

import pytest

from engine.core.units import GIB, MIB
from engine.monitor.nvml import NvmlSource
from engine.monitor.recording import ReplaySource, load_recording, save_recording
from tests.fake_nvml import FakeNvml, fake_details, three_gpus

pytest.importorskip("pytestqt")


def _record(tmp_path, n=5, name="session.jsonl", fill_gpu0_at=None):
    """A session from the stand-in: GPU 0 grows 1 GiB per sample; GPU 1 is lost in sample 2."""
    fake = FakeNvml(three_gpus())
    t = [1_750_000_000.0]
    src = NvmlSource(fake, process_details=fake_details, clock=lambda: t[0])
    snaps = []
    for k in range(n):
        fake.gpus[0].used = (30000 * MIB if fill_gpu0_at is None or k < fill_gpu0_at else 75 * GIB) + k * GIB
        fake.gpus[1].lost = k == 2
        snaps.append(src.sample())
        t[0] += 1.0
    return save_recording(tmp_path / name, snaps), snaps


def test_no_driver_message(monitor_panel):
    p = monitor_panel(source=NvmlSource(FakeNvml([], library_missing=True)), autostart=False)
    p.sample_now()
    assert p.message_text() == ("No NVIDIA GPU to monitor: NVIDIA driver not installed "
                                "(the NVML library libnvidia-ml was not found).\n"
                                "Estimates work without one; “Open recording…” replays a session recorded on a GPU "
                                "machine.")
    assert p.cards == {}


def test_no_driver_on_this_machine_with_the_real_binding(monitor_panel, qtbot):
    p = monitor_panel()  # the default: real NVML on a sampler thread
    qtbot.waitUntil(lambda: p.buffer.last() is not None, timeout=3000)
    p.refresh()
    if p.buffer.last().gpus:
        pytest.skip("this machine has an NVIDIA GPU")
    assert p.message_text().startswith("No NVIDIA GPU to monitor: ")
    p.shutdown()
    assert not p.sampler.running


def test_replay_shows_recorded_figures(monitor_panel, tmp_path):
    path, snaps = _record(tmp_path)
    p = monitor_panel(source=NvmlSource(FakeNvml([], library_missing=True)), autostart=False)
    assert p.open_recording(path) and p.mode == "replay"
    assert p.replay_position == 4  # opens on the last sample
    c0, c1, c2 = p.cards[0], p.cards[1], p.cards[2]
    # 30000 MiB + 4 GiB = 33.30 GiB of the A100's 81920 MiB (80.00 GiB)
    assert "33.30 GiB / 80.00 GiB (42%)" in c0.memory.text() and "reserved 559.00 MiB" in c0.memory.text()
    assert "312 W / 400 W" in c0.thermal.text() and "61 °C" in c0.thermal.text()
    assert "utilization GPU 87% · memory 45%" == c0.util.text()
    assert "fan n/a" in c1.thermal.text() and "not supported" in c1.thermal.toolTip()
    assert c2.mig.text().startswith("MIG on, 2 slice(s): 0: 4.88 GiB / 9.62 GiB")
    p.show_position(0)
    assert "29.30 GiB / 80.00 GiB (37%)" in c0.memory.text()
    p.show_position(2)
    assert not c1.status.isHidden() and c1.status.text().startswith("GPU lost: ")
    assert "NVIDIA A40" in c1.title.text()
    # the history plot draws the recording up to the position, in GiB, seconds before it
    p.plots.repaint_from_buffer(force=True)
    x, y = p.plots.curve_data("memory", 0)
    assert list(x) == [-2.0, -1.0, 0.0]
    assert y == pytest.approx([30000 / 1024 + k for k in range(3)])
    x1, y1 = p.plots.curve_data("memory", 1)
    assert y1[2] != y1[2]  # NaN: a gap where the GPU was lost


def test_replay_source_opens_in_replay_and_table_filters(monitor_panel, tmp_path):
    _, snaps = _record(tmp_path)
    p = monitor_panel(source=ReplaySource(snaps))
    assert p.mode == "replay" and sorted(p.cards) == [0, 1, 2]
    rows = p.process_table.visible_rows()
    assert [r[1] for r in rows][:2] == ["1111", "2222"]  # sorted by memory, biggest first
    assert any(r[5] == "(access denied)" and r[2] == "?" for r in rows)
    p.process_table.user = "bob"
    p.process_table.set_own_only(True)
    assert [r[1] for r in p.process_table.visible_rows()] == ["2222"]
    p.process_table.set_own_only(False)
    assert len(p.process_table.visible_rows()) == len(rows)


def test_estimate_overlay(monitor_panel, tmp_path):
    _, snaps = _record(tmp_path)
    p = monitor_panel(source=ReplaySource(snaps))
    p.set_estimate_overlay("llama-7b", 14 * GIB)
    g0 = snaps[-1].gpus[0]
    free = g0.memory_free
    assert free == (81920 - 559 - 30000) * MIB - 4 * GIB
    text = p.cards[0].overlay.text()
    assert text == "llama-7b needs 14.00 GiB, this GPU has 46.16 GiB free: fits"
    p.set_estimate_overlay("gpt-30b", 60 * GIB)
    assert p.cards[0].overlay.text().endswith("short by 13.84 GiB")
    assert p.plots._overlay_line is not None and p.plots._overlay_line.value() == pytest.approx(60.0)
    p.set_estimate_overlay("gpt-30b", None)
    assert p.cards[0].overlay.isHidden() and p.plots._overlay_line is None
    # the main window hands over an Estimate: its predicted nvidia-smi figure is the one compared
    from types import SimpleNamespace

    p.set_estimate(SimpleNamespace(model_name="resnet50", peak_bytes=5 * GIB,
                                   gpu=SimpleNamespace(nvidia_smi_bytes=6 * GIB)))
    assert p.cards[0].overlay.text().startswith("resnet50 needs 6.00 GiB")
    p.set_estimate(None)
    assert p.cards[0].overlay.isHidden()


def test_replay_alerts_marked(monitor_panel, tmp_path):
    # 75 GiB + 3 GiB > 95 % of 80 GiB from sample 3 (never over the card: a recording with negative free is refused)
    path, _ = _record(tmp_path, fill_gpu0_at=3)
    p = monitor_panel(source=NvmlSource(FakeNvml([], library_missing=True)), autostart=False)
    p.open_recording(path)
    kinds = [(a.kind, a.gpu_index) for a in p.alerts]
    assert ("memory", 0) in kinds and ("lost", 1) in kinds
    p.show_position(4)
    assert not p.cards[0].alert.isHidden() and "memory at" in p.cards[0].alert.text()
    p.show_position(0)
    assert p.cards[0].alert.isHidden()


def test_bad_recording_keeps_the_panel(monitor_panel, tmp_path):
    bad = tmp_path / "notes.csv"
    bad.write_text("hello,world\n")
    p = monitor_panel(source=NvmlSource(FakeNvml([], library_missing=True)), autostart=False)
    assert not p.open_recording(bad) and p.mode == "live"
    assert "not a VRAMScope monitor recording" in p.status_label.text()


def test_live_sampling_recording_and_shutdown(monitor_panel, qtbot, tmp_path):
    fake = FakeNvml(three_gpus())
    p = monitor_panel(source=NvmlSource(fake, process_details=fake_details), interval=0.1, refresh_ms=20,
                   autostart=False)
    assert p.start_recording(tmp_path / "live.csv")  # starts sampling too
    qtbot.waitUntil(lambda: p.recorded_samples >= 2 and sorted(p.cards) == [0, 1, 2], timeout=3000)
    assert "29.30 GiB / 80.00 GiB" in p.cards[0].memory.text()
    path = p.stop_recording()
    assert len(load_recording(path)) >= 2
    p.open_recording(path)
    assert p.mode == "replay"
    p.back_to_live()
    assert p.mode == "live" and p.sampler.running
    p.shutdown()
    assert not p.sampler.running
    p.shutdown()  # twice is harmless


def test_live_gpu_lost_and_back_and_threshold_colours(monitor_panel):
    from engine.monitor.alerts import Thresholds
    from gui.monitor.cards import LEVEL_COLOURS

    fake = FakeNvml(three_gpus())
    p = monitor_panel(source=NvmlSource(fake, process_details=fake_details), autostart=False)
    p.sample_now()
    assert p.cards[1].status.isHidden() and p.cards[0].bar.colour == LEVEL_COLOURS["ok"]  # 37 % used
    fake.gpus[1].lost = True
    p.sample_now()
    assert p.cards[1].status.text() == "GPU lost: GPU is lost (fell off the bus); waiting for it to come back"
    assert "29.30 GiB / 80.00 GiB" in p.cards[0].memory.text()  # the other GPUs carry on
    assert [a.kind for a in p.alerts] == ["lost"] and "GPU 1" in p.alert_list.item(0).text()
    fake.gpus[1].lost = False
    p.sample_now()
    assert p.cards[1].status.isHidden() and "29 °C" in p.cards[1].thermal.text()
    p.set_thresholds(Thresholds(memory_warn=0.30, memory_alert=0.35))
    assert p.cards[0].bar.colour == LEVEL_COLOURS["alert"]
    p.sample_now()
    assert any(a.kind == "memory" and a.gpu_index == 0 for a in p.alerts)


def test_thresholds_dialog_round_trip(qtbot):
    from engine.monitor.alerts import Thresholds
    from gui.monitor.thresholds import ThresholdsDialog

    th = Thresholds(memory_warn=0.7, memory_alert=0.9, temp_alert_c=85, leak_window_s=120)
    dlg = ThresholdsDialog(th)
    qtbot.addWidget(dlg)
    assert dlg.thresholds() == th
    dlg.mem_warn.setValue(95)  # above the alert level: lowered to it
    assert dlg.thresholds().memory_warn == 0.9


def test_replay_plays_through(monitor_panel, qtbot, tmp_path):
    _, snaps = _record(tmp_path)
    p = monitor_panel(source=ReplaySource(snaps))
    p.show_position(0)
    p.speed_combo.setCurrentIndex(p.speed_combo.findData(60.0))  # 1 s apart → 20 ms steps
    p.play_button.setChecked(True)
    qtbot.waitUntil(lambda: p.replay_position == 4, timeout=2000)
    qtbot.waitUntil(lambda: not p.play_button.isChecked(), timeout=1000)  # stops at the end
    assert "33.30 GiB / 80.00 GiB" in p.cards[0].memory.text()


def test_a_report_carries_the_gpus_as_last_sampled(monitor_panel, tmp_path):
    """File → Export report takes the monitor's last live sample: each GPU's memory and the processes on it."""
    import re

    pypdf = pytest.importorskip("pypdf")
    from engine.config.train_config import TrainConfig
    from engine.core.units import format_bytes
    from engine.planning.estimator import estimate
    from report import build_report

    fake = FakeNvml(three_gpus())
    p = monitor_panel(source=NvmlSource(fake, process_details=fake_details), autostart=False)
    assert p.report_snapshot() is None  # nothing sampled yet
    snap = p.sample_now()
    rep = p.report_snapshot()
    assert [g["memory_used_bytes"] for g in rep["gpus"]] == [g.memory_used for g in snap.gpus]
    assert [g["name"] for g in rep["gpus"]] == [g.name for g in snap.gpus]
    assert len(rep["processes"]) == sum(len(g.processes) for g in snap.gpus) > 0
    assert rep["driver_version"] == snap.driver_version
    out = tmp_path / "r.pdf"
    est = estimate("resnet18", TrainConfig(batch_size=1, device="cpu", mode="inference"))
    build_report(out, est, gpu_snapshot=rep)
    text = " ".join(re.sub(r"\s+", " ", pg.extract_text()) for pg in pypdf.PdfReader(str(out)).pages)
    assert "GPU snapshot" in text and snap.gpus[0].name in text and "memory used" in text
    assert format_bytes(snap.gpus[0].memory_used) in text
