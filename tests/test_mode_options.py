"""Issue 27 item 7: outside training, saying there is no optimizer (--optimizer none) or no accumulation
(--grad-accum 1) is accepted by every command that takes the configuration; only a real optimizer or accumulation
is refused. Training-only settings the app's panel keeps (greyed) when its mode changes, or a sketch file carries,
never reach an inference pass's figures, notes or report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import main as entry
from cli.common import config_from_args
from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.models.sources import resolve_source
from engine.planning.estimator import estimate
from engine.sketch.document import Sketch

FIX = Path(__file__).resolve().parent / "fixtures"
TINY = f"{FIX / 'cli_models.py'}:tiny"
NOTHING_TO_TRAIN = ["--optimizer", "none", "--grad-accum", "1"]
# The commands whose parser takes the configuration (add_model_options): every one but monitor, open and diff.
CONFIGURED = [name for name in entry.COMMANDS if name not in ("monitor", "open", "diff")]


def _parse(command: str, *argv: str) -> argparse.Namespace:
    output = ["-o", "r.pdf"] if command == "report" else []  # parsed only: nothing is written
    return entry._build_parser().parse_args([command, "m", *output, *argv])


@pytest.mark.parametrize("command", CONFIGURED)
@pytest.mark.parametrize("mode", ["inference", "generate"])
def test_every_command_takes_no_optimizer_outside_training(command, mode):
    cfg = config_from_args(_parse(command, "--mode", mode, *NOTHING_TO_TRAIN))
    assert (cfg.mode, cfg.optimizer, cfg.grad_accum) == (mode, "none", 1)
    with pytest.raises(UserError, match=f"--mode {mode}: --optimizer only applies to training"):
        config_from_args(_parse(command, "--mode", mode, "--optimizer", "sgd"))
    with pytest.raises(UserError, match="--grad-accum only applies to training"):
        config_from_args(_parse(command, "--mode", mode, "--grad-accum", "2"))
    with pytest.raises(UserError, match="--optimizer none: --fused needs an optimizer"):
        config_from_args(_parse(command, "--optimizer", "none", "--fused"))


def _tiny_llama(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=256)))
    return str(path)


@pytest.mark.parametrize("argv", [
    ["estimate", TINY, "--json"],
    ["plan", TINY, "--json"],
    ["max-batch", TINY, "--budget", "0.001", "--json"],
    ["profile", TINY, "--json"],
    ["report", TINY, "--no-plan", "-o", "{tmp}/r.pdf"],
    ["max-context", "{llama}", "--budget", "0.05", "--mode", "generate", "--new-tokens", "4", "--json"],
], ids=lambda argv: argv[0])
def test_each_command_runs_an_inference_pass_given_the_whole_configuration(argv, tmp_path, capsys):
    pytest.importorskip("transformers")
    argv = [a.format(tmp=tmp_path, llama=_tiny_llama(tmp_path)) for a in argv]
    mode = [] if "--mode" in argv else ["--mode", "inference"]
    rc = entry.main([*argv, "--device", "cpu", *mode, *NOTHING_TO_TRAIN])
    out, err = capsys.readouterr()
    assert rc == 0, err
    if argv[0] == "report":
        assert (tmp_path / "r.pdf").stat().st_size > 0
    elif argv[0] != "max-context":
        d = json.loads(out)
        config = d.get("estimate", d).get("config") if argv[0] != "max-batch" else None
        if config is not None:
            assert (config["mode"], config["optimizer"]) == ("inference", "none")


def test_training_settings_left_in_a_sketch_file_do_not_reach_an_inference_pass():
    from report.content import config_rows

    sk = Sketch.from_json({"format": "vramscope-sketch", "version": 1, "nodes": [], "edges": [],
                           "training": {"mode": "inference", "optimizer": "paged-adamw8bit", "grad_accum": 4,
                                        "checkpointing": True, "fused": True, "device": "cpu"}})
    assert sk.training is not None
    cfg = TrainConfig.from_json(sk.training)
    assert (cfg.mode, cfg.grad_accum, cfg.checkpointing, cfg.fused) == ("inference", 1, False, False)
    est = estimate(resolve_source(TINY), cfg)
    assert est.peak_bytes == estimate(resolve_source(TINY), TrainConfig(mode="inference", device="cpu")).peak_bytes
    assert not any("paged" in m for m in est.modelled)
    rows = dict(config_rows(est))
    assert (rows["Checkpointing"], rows["Grad. accumulation"]) == ("off", "1 micro-batch")


def test_the_panel_round_trips_an_inference_pass_with_no_optimizer(qtbot):
    """Optimizer "None", accumulation and checkpointing set with real keys, then Mode → Inference: the pass has
    no optimizer and no training-only setting, and it comes back unchanged from a sketch file."""
    from PySide6.QtCore import Qt

    from gui.config_panel import ConfigPanel

    panel = ConfigPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.optimizer.setFocus()
    qtbot.keyClick(panel.optimizer, Qt.Key.Key_End)  # the last entry: None (no optimizer step)
    assert panel.optimizer.currentData() == "none"
    panel.grad_accum.selectAll()
    qtbot.keyClicks(panel.grad_accum, "4")
    panel.checkpointing.setFocus()
    qtbot.keyClick(panel.checkpointing, Qt.Key.Key_Space)
    assert panel.checkpointing.isChecked() and panel.grad_accum.value() == 4
    panel.mode.setFocus()
    qtbot.keyClick(panel.mode, Qt.Key.Key_Down)  # Training → Inference
    assert panel.mode.currentData() == "inference" and not panel.optimizer.isEnabled()
    with qtbot.waitSignal(panel.configChanged, timeout=5000) as blocker:
        panel.flush()
    cfg = blocker.args[0]
    assert not panel.message.isVisible()
    assert (cfg.mode, cfg.optimizer, cfg.grad_accum, cfg.checkpointing) == ("inference", "none", 1, False)
    sk = Sketch("s")
    sk.training = cfg.to_json()
    reopened = Sketch.from_json(json.loads(sk.to_json_text()))
    assert reopened.training is not None
    panel.set_config(TrainConfig.from_json(reopened.training))
    assert panel.config() == cfg


def test_the_plan_of_an_inference_pass_names_no_optimizer(capsys):
    """`plan` said 'inference, batch 1, fp32, optimizer adam' (the default it never runs); `estimate` did not."""
    for command in ("plan", "estimate"):
        assert entry.main([command, TINY, "--device", "cpu", "--mode", "inference"]) == 0
        step = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Step"))
        assert step.startswith("Step        inference, batch 1, fp32") and "optimizer" not in step, (command, step)
    assert entry.main(["plan", TINY, "--device", "cpu", "--optimizer", "sgd"]) == 0
    assert "train, batch 1, fp32, optimizer sgd" in capsys.readouterr().out
