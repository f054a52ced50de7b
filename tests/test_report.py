"""The PDF / HTML / JSON memory report, from real estimator output: figures, pages, rendering, error paths, CLI."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

pypdf = pytest.importorskip("pypdf")

from engine.config.train_config import TrainConfig  # noqa: E402
from engine.core.errors import Cancelled, UserError  # noqa: E402
from engine.core.units import format_bytes  # noqa: E402

# torchvision's published parameter count of ResNet-18 (https://pytorch.org/vision/stable/models.html)
RESNET18_PARAMS = 11_689_512


@pytest.fixture(scope="module")
def qapp():
    from report import ensure_gui_application

    return ensure_gui_application()


@pytest.fixture(scope="module")
def est():
    from engine.models.sources import resolve_source
    from engine.planning.estimator import estimate

    return estimate(resolve_source("resnet18"), TrainConfig(device="cpu", batch_size=2))


@pytest.fixture(scope="module")
def report(tmp_path_factory, qapp, est):
    from report import build_report

    out = tmp_path_factory.mktemp("report") / "resnet18.pdf"
    seen = []
    t0 = time.perf_counter()
    build_report(out, est, progress=lambda f, text: seen.append((f, text)))
    elapsed = time.perf_counter() - t0
    return out, elapsed, seen, _pages_text(out)


def _pages_text(path) -> list[str]:
    reader = pypdf.PdfReader(str(path))
    return [re.sub(r"\s+", " ", p.extract_text()) for p in reader.pages]


def _digits(text: str) -> str:
    return re.sub(r"[\s\u2009\u202f]+", "", text)


def test_pdf_states_the_engine_figures(report, est):
    path, _, _, pages = report
    text = " ".join(pages)
    assert est.parameters == RESNET18_PARAMS  # the estimate is of the real ResNet-18
    for word in ("Memory report: resnet18", "Configuration", "Summary", "Breakdown at the peak", "Timeline",
                 "Per layer", "Recommendations", "Estimate and measurement", "Method", "Versions"):
        assert word in text, word
    assert format_bytes(est.peak_bytes) in text
    assert str(est.peak_bytes) in _digits(text)
    assert str(RESNET18_PARAMS) in _digits(text)
    # fp32 weights: 4 bytes per parameter, as the table says
    assert est.breakdown_at_peak["parameters"] == 4 * RESNET18_PARAMS
    for cat, b in est.breakdown_at_peak.items():
        if b > 0:
            assert format_bytes(b) in text, cat
            assert f"{100 * b / est.peak_bytes:.1f} %" in text, cat
    from engine.results.module_groups import fold_modules

    groups = fold_modules(est.per_module)
    assert any(g.label == "layer1.0–1.conv1 ×2" for g in groups)  # ResNet's two BasicBlocks of layer1
    for g in groups[:25]:
        assert g.label in text
        assert format_bytes(g.bytes_at_peak) in text
    rest = sum(g.count for g in groups[25:])
    assert rest and f"{rest} other modules" in text
    assert format_bytes(sum(g.bytes_at_peak for g in groups[25:])) in text
    # the timeline chart is drawn as vector text and paths, not a picture
    assert "allocation events through the step" in text


def test_pdf_pages_header_footer_fonts_and_size(report, est):
    path, elapsed, seen, pages = report
    reader = pypdf.PdfReader(str(path))
    n = len(reader.pages)
    assert 3 <= n <= 8
    for i, page in enumerate(pages, 1):
        assert f"Page {i} of {n}" in page
        assert "VRAMScope memory report · resnet18 · batch 2 · fp32" in page
    # A4 in points
    assert [round(float(x)) for x in reader.pages[0].mediabox[2:]] == [595, 842]
    # fonts are embedded (a FontFile2 stream on every font descriptor)
    fonts = set()
    for page in reader.pages:
        for f in page["/Resources"]["/Font"].values():
            f = f.get_object()
            desc = (f["/DescendantFonts"][0].get_object()["/FontDescriptor"] if "/DescendantFonts" in f
                    else f["/FontDescriptor"])
            assert any(k in desc for k in ("/FontFile", "/FontFile2", "/FontFile3")), f["/BaseFont"]
            fonts.add(f["/BaseFont"])
    assert fonts
    # no raster pictures bigger than the 1×1 transparent placeholder that reserves each chart's place
    for page in reader.pages:
        for xobj in page["/Resources"].get("/XObject", {}).values():
            xobj = xobj.get_object()
            if xobj["/Subtype"] == "/Image":
                assert (xobj["/Width"], xobj["/Height"]) == (1, 1)
    assert path.stat().st_size < 5 * 1024 * 1024
    assert seen[0][0] == 0.0 and seen[-1][0] == 1.0
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False))
    assert reader.metadata.title == "Memory report: resnet18"


@pytest.mark.skipif(shutil.which("pdftoppm") is None, reason="pdftoppm (poppler-utils) not installed")
def test_pdf_pages_render_non_blank(report, tmp_path, qapp):
    from PySide6.QtGui import QColor, QImage

    from render.colors import CATEGORY_COLORS

    path, _, _, _ = report
    subprocess.run(["pdftoppm", "-png", "-r", "40", "-f", "1", "-l", "2", str(path), str(tmp_path / "p")], check=True)
    pngs = sorted(tmp_path.glob("p-*.png"))
    assert len(pngs) == 2
    green = QColor(CATEGORY_COLORS["activations"])
    found_chart_colour = False
    for png in pngs:
        img = QImage(str(png))
        assert not img.isNull()
        ink = 0
        total = 0
        for y in range(0, img.height(), 2):
            for x in range(0, img.width(), 2):
                c = img.pixelColor(x, y)
                total += 1
                if c.lightness() < 240:
                    ink += 1
                if abs(c.red() - green.red()) + abs(c.green() - green.green()) + abs(c.blue() - green.blue()) < 30:
                    found_chart_colour = True
        assert ink / total > 0.02, png.name
    assert found_chart_colour  # the donut / timeline were painted


def test_letter_page_size(tmp_path, qapp, est):
    from report import build_report

    out = tmp_path / "r.pdf"
    build_report(out, est, page="Letter")
    reader = pypdf.PdfReader(str(out))
    assert [round(float(x)) for x in reader.pages[0].mediabox[2:]] == [612, 792]
    with pytest.raises(UserError, match="page size"):
        build_report(out, est, page="a3")


def test_html_and_json_carry_the_same_figures(tmp_path, qapp, est):
    from report import export_html, export_json

    h, j = tmp_path / "r.html", tmp_path / "r.json"
    export_html(h, est)
    export_json(j, est)
    html = h.read_text(encoding="utf-8")
    data = json.loads(j.read_text(encoding="utf-8"))
    assert "<svg" in html and html.count("<svg") == 2  # donut and timeline, vector
    assert format_bytes(est.peak_bytes) in html
    for _cat, b in est.breakdown_at_peak.items():
        if b > 0:
            assert format_bytes(b) in html
    s = data["report"]["summary"]
    assert s["peak_allocated_bytes"] == est.peak_bytes == data["estimate"]["peak_bytes"]
    assert s["parameters"] == RESNET18_PARAMS
    assert {r["category"]: r["bytes"] for r in data["report"]["breakdown"]} == {
        c: b for c, b in est.breakdown_at_peak.items() if b > 0
    }
    assert data["report"]["breakdown_total_bytes"] == est.peak_bytes
    from engine.results.module_groups import fold_modules

    assert [r["name"] for r in data["report"]["per_module"]["top"]] == [
        g.label or "(top level)" for g in fold_modules(est.per_module)[:25]
    ]
    assert data["format"] == "vramscope-report/1"


def test_recommendations_measured_and_snapshot(tmp_path, qapp, est):
    from dataclasses import replace

    from report import build_report
    from report.content import report_facts

    try:
        from engine.planning.planner import MaxBatchResult, Recommendation
    except ImportError:
        pytest.skip("planner not available")
    rec = Recommendation(title="Mixed precision (AMP bf16)", detail="autocast halves the activations",
                         saves_bytes=est.breakdown_at_peak["activations"] // 2,
                         new_peak_bytes=est.peak_bytes - est.breakdown_at_peak["activations"] // 2, cost="none")
    best = MaxBatchResult(batch_size=96, peak_bytes=est.peak_bytes, traces_run=3, fits_at_next=False,
                          peak_next=None, budget_bytes=16 << 30)
    # a "measurement" 10 % above the estimate: the error column must say -9.1 %
    measured = replace(est, source="profiler-cpu", peak_bytes=int(est.peak_bytes * 1.1))
    snap = {"driver_version": "550.54.15", "gpus": [{"index": 0, "name": "NVIDIA T4", "memory_used_bytes": 1 << 30}]}
    out = tmp_path / "r.pdf"
    build_report(out, est, recommendations=[rec], max_batch=best.batch_size, measured=measured, gpu_snapshot=snap)
    text = " ".join(_pages_text(out))
    assert "Mixed precision (AMP bf16)" in text
    assert format_bytes(rec.saves_bytes) in text
    assert "Largest batch that fits 96" in text
    assert "profiler-cpu" in text
    err = (est.peak_bytes - measured.peak_bytes) / measured.peak_bytes
    assert f"{100 * err:+.1f} %" in text
    assert format_bytes(est.peak_bytes - measured.peak_bytes) in text
    assert "550.54.15" in text and "NVIDIA T4" in text and "1.00 GiB" in text
    facts = report_facts(est, recommendations=[rec], max_batch=best.batch_size, measured=measured)
    assert facts["summary"]["max_batch"] == 96
    assert facts["recommendations"][0]["saves_bytes"] == rec.saves_bytes
    assert facts["comparison"]["rows"][0]["error_bytes"] == est.peak_bytes - measured.peak_bytes


def test_table_rows_never_split_across_pages(tmp_path, qapp, est):
    """Multi-line rows (here: long recommendations) move whole to the next page, under a repeated header."""
    from report import build_report

    try:
        from engine.planning.planner import Recommendation
    except ImportError:
        pytest.skip("planner not available")
    recs = [
        Recommendation(title=f"Change number {i}", detail=" ".join(["because the activations are large"] * (3 + i % 4))
                       + f" end-of-row-{i}", saves_bytes=(20 - i) << 20, new_peak_bytes=est.peak_bytes,
                       cost="some cost")
        for i in range(24)
    ]
    out = tmp_path / "long.pdf"
    build_report(out, est, recommendations=recs)
    pages = _pages_text(out)
    spans = set()
    for i in range(24):
        title = [n for n, t in enumerate(pages) if f"Change number {i} " in t]
        end = [n for n, t in enumerate(pages) if f"end-of-row-{i} " in t]
        assert len(title) == 1 and title == end, (i, title, end)
        spans.add(title[0])
    assert len(spans) >= 2  # the table did break across pages…
    for n in sorted(spans)[1:]:
        assert "# Recommendation Saves Peak after" in pages[n]  # …with its header repeated


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_unwritable_paths_raise_user_error(tmp_path, qapp, est):
    from report import build_report, export_html, export_json

    with pytest.raises(UserError, match="does not exist"):
        build_report(tmp_path / "missing" / "r.pdf", est)
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    with pytest.raises(UserError, match="cannot write"):
        build_report(afile / "r.pdf", est)
    with pytest.raises(UserError, match="folder"):
        export_json(tmp_path, est)  # a folder, not a file name
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            with pytest.raises(UserError, match="permission denied"):
                export_html(ro / "r.html", est)
            assert _leftovers(ro) == []
        finally:
            ro.chmod(0o700)
    assert _leftovers(tmp_path) == ["file.txt"]


def test_full_disk_leaves_old_file_and_no_temp(tmp_path, qapp, est, monkeypatch):
    from report import build_report, saving

    out = tmp_path / "r.pdf"
    out.write_bytes(b"old report")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(saving.os, "fsync", full)
    with pytest.raises(UserError, match="disk is full"):
        build_report(out, est)
    assert out.read_bytes() == b"old report"
    assert _leftovers(tmp_path) == ["r.pdf"]


def test_cancel_writes_nothing(tmp_path, qapp, est):
    from report import build_report

    stop = threading.Event()
    stop.set()
    with pytest.raises(Cancelled):
        build_report(tmp_path / "r.pdf", est, cancel=stop)
    assert _leftovers(tmp_path) == []


def test_build_report_in_a_worker_thread(tmp_path, qapp, est):
    """The app exports off the GUI thread: QPdfWriter/QPainter/QTextDocument only, no widgets."""
    from PySide6.QtCore import QThread

    from report import build_report

    out = tmp_path / "thread.pdf"
    errors = []

    class Worker(QThread):
        def run(self):
            try:
                build_report(out, est)
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

    w = Worker()
    w.start()
    assert w.wait(60_000)
    assert not errors
    reader = pypdf.PdfReader(str(out))
    assert format_bytes(est.peak_bytes) in re.sub(r"\s+", " ", reader.pages[0].extract_text())


def test_cli_report(tmp_path, qapp, est, monkeypatch):
    import engine.planning.estimator
    import main

    # The estimate of these options was traced once already (the `est` fixture, the same engine call): hand it
    # over instead of tracing again, after checking the CLI built exactly that configuration.
    def same_estimate(source, cfg):
        assert source.name == "resnet18"
        assert cfg == est.config
        return est

    monkeypatch.setattr(engine.planning.estimator, "estimate", same_estimate)
    pdf, html, js = tmp_path / "cli.pdf", tmp_path / "cli.html", tmp_path / "cli.json"
    rc = main.main(["report", "resnet18", "--device", "cpu", "--batch-size", "2", "--no-plan", "-o", str(pdf),
                    "--html", str(html), "--json", str(js), "--page", "letter"])
    assert rc == 0
    reader = pypdf.PdfReader(str(pdf))
    assert [round(float(x)) for x in reader.pages[0].mediabox[2:]] == [612, 792]
    data = json.loads(js.read_text())
    assert data["estimate"]["peak_bytes"] == est.peak_bytes
    assert data["estimate"]["breakdown_at_peak"] == est.breakdown_at_peak
    text = " ".join(_pages_text(pdf))
    assert format_bytes(est.peak_bytes) in text and format_bytes(est.peak_bytes) in html.read_text()


def test_cli_bad_output_fails_fast():
    # a fresh interpreter with no display: the command must not need one, and must not trace before failing
    env = {**os.environ}
    env.pop("DISPLAY", None)
    env.pop("QT_QPA_PLATFORM", None)
    p = subprocess.run([sys.executable, "main.py", "report", "resnet18", "-o", "/nonexistent-dir/x.pdf"],
                       cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("error: cannot write '/nonexistent-dir/x.pdf'")
    assert "Traceback" not in p.stderr


def test_gpu_target_report_splits_nvidia_smi(tmp_path, qapp):
    """For a GPU target the report adds nvidia-smi's figure split by category (it adds up to that figure)."""
    from engine.models.sources import resolve_source
    from engine.planning.estimator import estimate
    from report import build_report, export_json

    gpu_est = estimate(resolve_source("resnet18"), TrainConfig(batch_size=2, gpu="T4"))
    j = tmp_path / "r.json"
    export_json(j, gpu_est)
    rows = json.loads(j.read_text(encoding="utf-8"))["report"]["gpu_breakdown"]
    assert {r["category"]: r["bytes"] for r in rows} == {
        c: b for c, b in gpu_est.gpu.breakdown_at_live_peak.items() if b > 0}
    assert sum(r["bytes"] for r in rows) == gpu_est.gpu.reserved_at_live_peak_bytes + gpu_est.gpu.cuda_context_bytes
    out = tmp_path / "gpu.pdf"
    build_report(out, gpu_est)
    text = " ".join(_pages_text(out))
    assert "nvidia-smi would show at the live peak" in text and "CUDA context" in text
    assert format_bytes(gpu_est.gpu.nvidia_smi_bytes) in text
    assert format_bytes(gpu_est.gpu.breakdown_at_live_peak["allocator_overhead"]) in text


def test_a_cpu_run_of_a_gpu_target_is_compared_with_the_cpu_estimate(tmp_path, qapp, est):
    """No GPU here: the measurement (a CPU run) is compared with the CPU's estimate of the same step, and said so;
    the target's figures stay the report's headline."""
    from engine.measure.cpu_profiler import profile
    from engine.models.sources import resolve_source
    from engine.planning.estimator import estimate
    from report import build_report
    from report.content import report_facts

    src = resolve_source("resnet18")
    target = estimate(src, TrainConfig(batch_size=2, gpu="T4"))
    measured = profile(src, target.config)  # no GPU: runs on the CPU
    assert measured.config.device == "cpu"
    facts = report_facts(target, measured=measured, measured_against=est)  # est: the CPU estimate, batch 2
    cmp_ = facts["comparison"]
    assert cmp_["against_device"] == "cpu"
    assert cmp_["rows"][0]["estimate_bytes"] == est.peak_bytes
    assert abs(cmp_["rows"][0]["error_relative"]) <= 0.01
    assert facts["summary"]["peak_allocated_bytes"] == target.peak_bytes
    out = tmp_path / "r.pdf"
    build_report(out, target, measured=measured, measured_against=est)
    text = " ".join(_pages_text(out))
    assert "compared with the estimate for the CPU" in text


def test_the_cli_reports_largest_batch_is_searched_against_the_usable_memory(monkeypatch):
    """`report --gpu T4` searched its largest batch against the card's total (15.0 GiB) where the verdict, max-batch
    and the app use what a process can use there (14.75 GiB): it could print a batch the verdict says does not fit."""
    from cli import report as cli_report
    from engine.config.gpus import find_gpu
    from engine.models.sources import resolve_source
    from engine.planning import planner
    from engine.planning.estimator import estimate

    seen: list[int] = []

    def fake_max_batch(source, cfg, budget, figure="peak", **kw):
        seen.append(budget)
        return None

    monkeypatch.setattr(planner, "max_batch", fake_max_batch)
    monkeypatch.setattr(planner, "recommend", lambda source, cfg, base=None, **kw: [])
    cfg = TrainConfig(batch_size=2, gpu="T4")
    est = estimate(resolve_source("resnet18"), cfg)
    cli_report._plan(resolve_source("resnet18"), cfg, est)
    assert seen == [find_gpu("T4").usable_bytes] and seen[0] < est.gpu.gpu_total_bytes


def test_a_report_says_why_no_batch_fits(monkeypatch, tmp_path):
    """When not even batch 1 fits, `report --gpu` failed as a whole (the search's error ended it) and the app's PDF
    said 'not computed': both now carry the search's answer."""
    from cli import report as cli_report
    from engine.core.errors import UserError
    from engine.models.sources import resolve_source
    from engine.planning import planner
    from engine.planning.estimator import estimate
    from report import build_report

    def none_fits(source, cfg, budget, figure="peak", **kw):
        raise UserError("even batch size 1 does not fit: it needs 27.00 GiB, 12.25 GiB more than the budget of "
                        "14.75 GiB", where="max-batch")

    monkeypatch.setattr(planner, "max_batch", none_fits)
    monkeypatch.setattr(planner, "recommend", lambda source, cfg, base=None, **kw: [])
    cfg = TrainConfig(batch_size=2, gpu="T4")
    est = estimate(resolve_source("resnet18"), cfg)
    recs, best, why = cli_report._plan(resolve_source("resnet18"), cfg, est)
    assert best is None and why == ("even batch size 1 does not fit: it needs 27.00 GiB, 12.25 GiB more than the "
                                    "budget of 14.75 GiB")
    out = tmp_path / "r.pdf"
    build_report(out, est, recommendations=recs, max_batch=None, max_batch_none=why)
    text = " ".join(_pages_text(out))
    assert "none — even batch size 1 does not fit" in text and "not computed" not in text
