"""TrainConfig is built in one place (TrainConfig.from_options) from the CLI's options and from the app's panel,
and both can set every field: a field added to TrainConfig without a CLI option or a panel control fails here."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from cli.common import add_model_options, config_from_args
from engine.config.train_config import TrainConfig
from engine.core.errors import UserError

# Every field away from its default, each in the mode it belongs to (issue 26: generation options given in train
# mode were silently ignored; they are refused now). TRAINING: every training and shared field (8 GPUs in ZeRO-3
# with tensor parallelism 2); GENERATION: every generation field.
TRAINING = TrainConfig(batch_size=7, optimizer="adamw", precision="amp-bf16", mode="train", checkpointing=True,
                       grad_accum=3, device="cuda", seq_len=96, image_size=64, fused=True, gpu="A100 80GB",
                       world_size=8, strategy="zero3", tp=2, alloc_conf="expandable_segments:True",
                       moe_routing="worst", peft="lora", lora_rank=8, lora_alpha=32, lora_targets="q_proj,v_proj",
                       weights="nf4", compile=True, full_trace=True, fold_own_code=True)
TRAINING_ARGS = ["m", "--batch-size", "7", "--optimizer", "adamw", "--precision", "amp-bf16", "--checkpointing",
                 "--grad-accum", "3", "--device", "cuda", "--seq-len", "96", "--image-size", "64", "--fused",
                 "--gpu", "A100 80GB", "--world-size", "8", "--strategy", "zero3", "--tp", "2",
                 "--alloc-conf", "expandable_segments:True", "--moe-routing", "worst", "--peft", "lora",
                 "--lora-rank", "8", "--lora-alpha", "32", "--lora-targets", "q_proj,v_proj", "--weights", "nf4",
                 "--compile", "--full-trace", "--fold-own-code"]
GENERATION = TrainConfig(mode="generate", gpu="A100 80GB", prompt_len=40, new_tokens=9, cache="static",
                         generate_program="loop", do_sample=True, top_k=5, top_p=0.5)
GENERATION_ARGS = ["m", "--mode", "generate", "--gpu", "A100 80GB", "--prompt-len", "40", "--new-tokens", "9",
                   "--cache", "static", "--generate-program", "loop", "--do-sample", "--top-k", "5", "--top-p", "0.5"]
GENERATION_OPTIONS = {"--prompt-len": ["40"], "--new-tokens": ["9"], "--cache": ["static"],
                      "--generate-program": ["loop"], "--do-sample": [], "--top-k": ["5"], "--top-p": ["0.5"]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_model_options(p)
    return p


def test_the_two_configs_change_every_field_but_device():
    default = TrainConfig()
    changed = {f.name for f in fields(TrainConfig)
               if getattr(TRAINING, f.name) != getattr(default, f.name)
               or getattr(GENERATION, f.name) != getattr(default, f.name)}
    assert {f.name for f in fields(TrainConfig)} - changed == {"device"}  # set the other way below


def test_every_field_is_a_cli_option(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    dests = {a.dest for a in _parser()._actions}
    assert {f.name for f in fields(TrainConfig)} <= dests
    assert config_from_args(_parser().parse_args(["m"])) == TrainConfig()
    assert config_from_args(_parser().parse_args(TRAINING_ARGS)) == TRAINING
    assert config_from_args(_parser().parse_args(GENERATION_ARGS)) == GENERATION
    inference = config_from_args(_parser().parse_args(["m", "--mode", "inference", "--device", "cpu"]))
    assert (inference.mode, inference.device) == ("inference", "cpu")


@pytest.mark.parametrize("mode", [None, "train", "inference"])
@pytest.mark.parametrize("option", sorted(GENERATION_OPTIONS))
def test_a_generation_option_outside_generate_mode_is_refused(monkeypatch, mode, option):
    # they were read by nothing: `estimate gpt2 --cache static` estimated a training step without a word
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    argv = ["m", option, *GENERATION_OPTIONS[option]] + (["--mode", mode] if mode else [])
    if option in ("--top-k", "--top-p"):
        argv.append("--do-sample")
    with pytest.raises(UserError) as e:
        config_from_args(_parser().parse_args(argv))
    head, _, rest = str(e.value).partition(" only appl")
    assert head.startswith(f"--mode {mode or 'train'}: ") and option in head.split(": ", 1)[1].split(", ")
    assert rest.endswith("to generation; drop it or use --mode generate") or "drop them" in rest


@pytest.mark.parametrize("option", ["--lora-rank", "--lora-alpha", "--lora-targets"])
def test_a_lora_option_without_peft_is_refused(monkeypatch, option):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    with pytest.raises(UserError, match=f"^{option}: .*add --peft lora"):
        config_from_args(_parser().parse_args(["m", option, "q_proj" if option == "--lora-targets" else "8"]))
    assert config_from_args(_parser().parse_args(["m", "--peft", "lora", "--lora-rank", "8"])).lora_rank == 8


def test_generation_options_outside_generate_mode_are_one_line_exit_2(capsys):
    import main as entry

    assert entry.main(["estimate", "gpt2", "--cache", "static", "--new-tokens", "9"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --mode train: --new-tokens, --cache only apply to generation; drop them or use "
                   "--mode generate\n")


def test_from_options_ignores_other_keys_and_validates():
    assert TrainConfig.from_options({"batch_size": 4, "model": "gpt2", "output": "x.pdf"}) == TrainConfig(batch_size=4)
    with pytest.raises(UserError, match="strategy 'zero3' shards across GPUs"):
        TrainConfig.from_options({"strategy": "zero3"})


def test_the_panel_sets_every_field(qtbot):
    pytest.importorskip("pytestqt")
    from gui.config_panel import ConfigPanel

    panel = ConfigPanel()
    qtbot.addWidget(panel)
    for changed in (TRAINING, GENERATION):
        panel.set_config(changed)
        assert panel.config() == changed
    other = TrainConfig(mode="inference", device="cpu")
    panel.set_config(other)
    assert panel.config() == other


def test_a_config_without_a_gpu_shows_the_default_target_not_the_last_one(qtbot):
    from gui.config_panel import ConfigPanel

    panel = ConfigPanel()
    qtbot.addWidget(panel)
    default = panel.config().gpu  # this machine's GPU, else the A100 80GB
    panel.set_config(TrainConfig(gpu="T4"))
    assert panel.config().gpu == "T4"
    panel.set_config(TrainConfig(batch_size=3))  # CUDA, no GPU named: the default, not the T4 shown before
    assert panel.config().gpu == default and panel.config().device == "cuda" and default != "T4"


def test_panel_edits_reach_the_config_with_real_keys(qtbot):
    from PySide6.QtCore import Qt

    from gui.config_panel import ConfigPanel

    panel = ConfigPanel()
    qtbot.addWidget(panel)
    panel.show()
    assert not panel.strategy.isEnabled()  # one GPU: nothing to shard
    panel.world_size.selectAll()
    qtbot.keyClicks(panel.world_size, "4")
    assert panel.strategy.isEnabled()
    panel.strategy.setCurrentIndex(panel.strategy.findData("zero2"))
    qtbot.mouseClick(panel.fused, Qt.MouseButton.LeftButton)
    qtbot.keyClicks(panel.alloc_conf, "expandable_segments:True")
    with qtbot.waitSignal(panel.configChanged, timeout=5000) as blocker:
        panel.flush()
    cfg = blocker.args[0]
    assert (cfg.world_size, cfg.strategy, cfg.fused, cfg.alloc_conf) == (4, "zero2", True, "expandable_segments:True")


def test_fine_tuning_controls_with_real_keys(qtbot):
    from PySide6.QtCore import Qt

    from gui.config_panel import ConfigPanel

    panel = ConfigPanel()
    qtbot.addWidget(panel)
    panel.show()
    assert not panel.lora_rank.isEnabled() and not panel.lora_targets.isEnabled()  # full fine-tuning: no adapters
    panel.peft.setFocus()
    qtbot.keyClick(panel.peft, Qt.Key.Key_Down)
    qtbot.keyClick(panel.peft, Qt.Key.Key_Down)  # Full → LoRA → QLoRA
    assert panel.peft.currentData() == "qlora" and panel.lora_rank.isEnabled()
    panel.lora_rank.selectAll()
    qtbot.keyClicks(panel.lora_rank, "64")
    qtbot.keyClicks(panel.lora_targets, "all-linear")
    panel.optimizer.setCurrentIndex(panel.optimizer.findData("paged-adamw8bit"))
    with qtbot.waitSignal(panel.configChanged, timeout=5000) as blocker:
        panel.flush()
    cfg = blocker.args[0]
    assert (cfg.peft, cfg.lora_rank, cfg.lora_targets, cfg.optimizer, cfg.weight_format) == \
        ("qlora", 64, "all-linear", "paged-adamw8bit", "nf4")
    # Quantized weights without adapters in training: the engine's one-line reason, shown at the panel.
    panel.peft.setCurrentIndex(panel.peft.findData(None))
    panel.weights.setCurrentIndex(panel.weights.findData("int8"))
    panel.flush()
    assert "frozen" in panel.message.text() and panel.message.isVisible()
