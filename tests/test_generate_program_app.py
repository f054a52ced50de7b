"""The configuration panel's generation program, chosen with the keys: model.generate() by default (greedy, or
sampling), the user's own decode loop as the other choice; the summary says which program its figures are of."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pytestqt")
pytest.importorskip("transformers")

from PySide6.QtCore import Qt  # noqa: E402

from tests.app_windows import press  # noqa: E402


def test_the_generation_program_is_chosen_in_the_panel_and_named_in_the_summary(qtbot, window, tmp_path,
                                                                             monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    fields = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "vocab_size": 200, "max_position_embeddings": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields), encoding="utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    panel = window.config_panel
    panel.seq_len.setValue(16)
    panel.new_tokens.setValue(4)
    panel.flush()
    with qtbot.waitSignal(window.estimateReady, timeout=120000):
        press(qtbot, window, "Ctrl+O")
    assert not panel._form.isRowVisible(panel._program_row)  # a training step has no generation program

    panel.mode.setFocus()
    with qtbot.waitSignal(window.estimateReady, timeout=120000) as blocker:
        for _ in range(2):  # Training step → Inference → Generation (KV cache)
            qtbot.keyClick(panel.mode, Qt.Key.Key_Down)
    est = blocker.args[0]
    assert panel._form.isRowVisible(panel._program_row)
    assert est.config.generate_program == "generate" and est.generation.program == "generate"
    assert window.results.summary.where.text().endswith("— model.generate(), greedy")

    assert not panel.top_k.isEnabled()  # greedy: nothing to sample from
    panel.do_sample.setFocus()
    with qtbot.waitSignal(window.estimateReady, timeout=120000) as blocker:
        qtbot.keyClick(panel.do_sample, Qt.Key.Key_Space)
    sampled = blocker.args[0]
    assert sampled.config.do_sample and sampled.generation.decoding == "sampling"
    assert window.results.summary.where.text().endswith("— model.generate(), sampling")
    assert panel.top_k.isEnabled() and panel.top_p.isEnabled()

    panel.generate_program.setFocus()
    with qtbot.waitSignal(window.estimateReady, timeout=120000) as blocker:
        qtbot.keyClick(panel.generate_program, Qt.Key.Key_Down)
    loop = blocker.args[0]
    assert loop.config.generate_program == "loop" and loop.generation.program == "loop"
    assert window.results.summary.where.text().endswith("— a hand-written prefill-then-decode loop")
    assert loop.peak_bytes != est.peak_bytes  # another program traced, not the same figures relabelled
    assert not panel.do_sample.isEnabled()  # a hand-written loop here takes the likeliest token
