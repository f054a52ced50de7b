"""The PDF's per-layer table on a LoRA Llama (module names of 50 characters): every column inside the page, and the
note on folded rows explained with a row of this model."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

pypdf = pytest.importorskip("pypdf")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from engine.config.train_config import TrainConfig  # noqa: E402

# Llama-2-7B's widths (so that the figures take their real room in the table), three layers of them.
WIDE_LLAMA = dict(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=3,
                  num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=512)
DPI = 150
A4_WIDTH_MM, RIGHT_MARGIN_MM, TOP_MM, BOTTOM_MM = 210.0, 18.0, 22.0, 297.0 - 20.0  # report.pdf's page and margins


@pytest.fixture(scope="module")
def lora_report(tmp_path_factory):
    from engine.models.sources import resolve_source
    from engine.planning.estimator import estimate
    from report import build_report, ensure_gui_application
    from report.content import report_facts

    ensure_gui_application()
    d = tmp_path_factory.mktemp("llama")
    (d / "config.json").write_text(json.dumps(WIDE_LLAMA))
    est = estimate(resolve_source(str(d)), TrainConfig(device="cpu", batch_size=1, seq_len=32, peft="lora"))
    out = d / "report.pdf"
    build_report(out, est)
    return out, report_facts(est)


def _layer_pages(path) -> list[int]:
    pages = [p.extract_text() for p in pypdf.PdfReader(str(path)).pages]
    return [i for i, t in enumerate(pages) if re.search(r"Module\s+Params\s+Weights", t)]


def test_every_column_of_the_per_layer_table_is_inside_the_page(lora_report, tmp_path):
    if shutil.which("pdftoppm") is None:
        pytest.skip("pdftoppm (poppler-utils) is not installed")
    path, facts = lora_report
    rows = facts["per_module"]["top"]
    assert max(len(r["name"]) for r in rows) >= 50  # 'model.layers.0–2.self_attn.q_proj.lora_A.default ×3'
    pages = _layer_pages(path)
    assert pages
    text = re.sub(r"\s+", " ", " ".join(pypdf.PdfReader(str(path)).pages[i].extract_text() for i in pages))
    assert "Share" in text
    for r in rows:  # every row's share of the peak is written
        assert f"{100 * r['share_of_peak']:.1f} %" in text
    # The page is painted clipped to the text column: a column past its edge is cut there, its ink up to the
    # last pixel. Right-aligned figures inside the column end a cell's padding (3 px, 0.8 mm) before it.
    edge = int((A4_WIDTH_MM - RIGHT_MARGIN_MM) / 25.4 * DPI)
    top, bottom = int(TOP_MM / 25.4 * DPI), int(BOTTOM_MM / 25.4 * DPI)
    from PySide6.QtGui import QImage

    for i in pages:
        subprocess.run(["pdftoppm", "-png", "-r", str(DPI), "-f", str(i + 1), "-l", str(i + 1), str(path),
                        str(tmp_path / f"p{i}")], check=True)
        img = QImage(str(next(tmp_path.glob(f"p{i}*.png"))))
        assert img.width() == round(A4_WIDTH_MM / 25.4 * DPI)
        ink = [(x, y) for y in range(top, bottom) for x in range(edge - 2, edge + 1)
               if img.pixelColor(x, y).lightness() < 160]
        assert not ink, f"page {i + 1}: text cut at the page's edge, at {ink[:3]}"


def test_the_folding_note_explains_a_folded_row_of_this_model(lora_report):
    path, facts = lora_report
    folded = [r["name"] for r in facts["per_module"]["top"] if r["count"] > 1]
    assert folded and all("0–2" in name for name in folded)
    text = re.sub(r"\s+", " ", " ".join(p.extract_text() for p in pypdf.PdfReader(str(path)).pages))
    note = text[text.index("Blocks a model repeats"):][:300]
    assert f"{folded[0]} is the " in note and " of layers 0 to 2 " in note  # this model's 3 layers
    assert "31" not in note
