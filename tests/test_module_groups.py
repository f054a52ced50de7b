"""Reports of large models (issue 13, item 6): repeated blocks fold into one row, names sort by their numbers,
and no cell of the PDF breaks a name or a figure."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from engine.config.train_config import TrainConfig  # noqa: E402
from engine.core.units import format_bytes  # noqa: E402
from engine.results.module_groups import fold_modules, natural_key  # noqa: E402
from engine.results.types import ModuleRow  # noqa: E402


def _row(name: str, typ: str, nbytes: int, params: int = 0) -> ModuleRow:
    return ModuleRow(name, typ, params, 4 * params, 0, 0, nbytes - 4 * params, nbytes, 0.01)


def test_numbers_in_names_sort_by_value():
    names = ["layers.10.mlp", "layers.2.mlp", "layers.1.mlp", "layers.1.attn", "embed"]
    assert sorted(names, key=natural_key) == ["embed", "layers.1.attn", "layers.1.mlp", "layers.2.mlp",
                                              "layers.10.mlp"]


def test_eighty_alike_blocks_fold_into_one_row_with_their_sums():
    rows = [_row(f"layers.{i}.mlp", "LlamaMLP", 1000, params=100) for i in range(80)]
    rows += [_row("lm_head", "Linear", 5000, params=1000), _row("layers.3.norm", "RMSNorm", 10)]
    groups = fold_modules(rows)
    assert [g.label for g in groups] == ["layers.0–79.mlp ×80", "lm_head", "layers.3.norm"]
    mlp = groups[0]
    assert (mlp.count, mlp.bytes_at_peak, mlp.parameters) == (80, 80_000, 8000)
    assert mlp.members[:3] == ("layers.0.mlp", "layers.1.mlp", "layers.2.mlp")  # natural order, not 0, 1, 10
    assert sum(g.bytes_at_peak for g in groups) == sum(r.bytes_at_peak for r in rows)


def test_blocks_of_another_type_or_with_gaps_stay_apart_or_say_so():
    rows = [_row("blocks.0", "Conv", 10), _row("blocks.1", "ReLU", 0), _row("blocks.2", "Conv", 10),
            _row("blocks.4", "Conv", 10), _row("blocks.5", "Conv", 10)]
    labels = {g.label for g in fold_modules(rows)}
    assert labels == {"blocks.0,2,4–5 ×4", "blocks.1"}


@pytest.fixture(scope="module")
def gpt2_pdf_text(tmp_path_factory):
    pypdf = pytest.importorskip("pypdf")
    from engine.models.sources import resolve_source
    from engine.planning.estimator import estimate
    from report import build_report, ensure_gui_application

    ensure_gui_application()
    est = estimate(resolve_source("gpt2"), TrainConfig(batch_size=1, seq_len=64, gpu="A100 80GB"))
    out = tmp_path_factory.mktemp("report") / "gpt2.pdf"
    build_report(out, est)
    pages = [p.extract_text() for p in pypdf.PdfReader(str(out)).pages]
    return est, re.sub(r"\s+", " ", " ".join(pages))


def test_the_report_of_a_transformer_folds_its_twelve_blocks(gpt2_pdf_text):
    est, text = gpt2_pdf_text
    groups = fold_modules(est.per_module)
    c_fc = next(g for g in groups if g.name == "h.0–11.mlp.c_fc")
    assert c_fc.count == 12 and "h.0–11.mlp.c_fc ×12" in text
    # No row per block: 'h.3.mlp.c_fc' is inside the folded row, not listed on its own.
    assert "h.3.mlp.c_fc" not in text and "h.10.mlp" not in text
    assert c_fc.bytes_at_peak == sum(r.bytes_at_peak for r in est.per_module
                                     if re.fullmatch(r"h\.\d+\.mlp\.c_fc", r.name))


def test_no_cell_breaks_inside_a_name_or_a_figure(gpt2_pdf_text):
    est, text = gpt2_pdf_text
    text = text.replace("\u00a0", " ")
    for g in fold_modules(est.per_module)[:25]:
        # A line break inside a cell shows as a space in the extracted text: each name, type and figure whole.
        assert g.name in text, g.name
        assert g.type in text, g.type  # e.g. GPT2LMHeadModel, CausalSelfAttention
        assert format_bytes(g.bytes_at_peak) in text, format_bytes(g.bytes_at_peak)
        assert f"{g.parameters:,}".replace(",", " ") in text, g.parameters


def test_blocks_fold_a_transformers_layers_and_keep_every_parameter():
    from engine.jobs.calls import module_tree
    from engine.results.module_groups import blocks

    rows = module_tree(("ref", "gpt2"), TrainConfig(batch_size=1))
    shown = blocks(rows)
    h = next(b for b in shown if b.name == "h.0–11")
    assert h.count == 12 and h.type == "Block"
    assert {c.label for c in h.children} >= {"h.0–11.attn ×12", "h.0–11.mlp ×12"}
    assert h.parameters == sum(total for name, _t, _own, total in rows if re.fullmatch(r"h\.\d+", name))
    # The tied output layer shows the weight it shares with the embedding: every other parameter is counted once.
    wte = next(b for b in shown if b.name == "wte")
    root = next(total for name, _t, _own, total in rows if name == "")
    assert sum(b.parameters for b in shown) == root + wte.parameters
