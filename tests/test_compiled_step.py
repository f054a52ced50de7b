"""`--compile`: the step as torch.compile(model) runs it (inductor, default mode), estimated on fake tensors from
inductor's own wrapper code (engine.trace.compiled_step) and checked against a real compiled CPU step."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

import main as entry
from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.measure.cpu_profiler import measure_cpu
from engine.models.sources import resolve_source
from engine.planning.estimator import estimate
from engine.results.types import Estimate

MODEL = f"{Path(__file__).resolve().parent / 'fixtures' / 'compile_models.py'}:chains"
TRAIN = TrainConfig(batch_size=256, optimizer="adamw", device="cpu")


@cache
def _compiled_estimate() -> Estimate:
    return estimate(resolve_source(MODEL), TRAIN.with_(compile=True))


@cache
def _real_peak(cfg: TrainConfig) -> int:
    return measure_cpu(resolve_source(MODEL), cfg)[2]


def test_the_estimate_is_the_real_compiled_step():
    """A real torch.compile step (C++ kernels built, its compiling step run first) against the estimate: within
    1 %; the eager step keeps far more (the swish/tanh chain's intermediates), so a compile not modelled misses."""
    est = _compiled_estimate()
    compiled = _real_peak(TRAIN.with_(compile=True))
    eager = _real_peak(TRAIN)
    assert abs(est.peak_bytes - compiled) <= 0.01 * compiled, (est.peak_bytes, compiled)
    assert eager > 1.15 * compiled  # compile changes this step's memory: the eager figure is no answer
    assert estimate(resolve_source(MODEL), TRAIN).peak_bytes > 1.15 * est.peak_bytes
    assert est.config.program == "compiled" and any("torch.compile" in n for n in est.notes)


def _live_at(events, step: int, phase: str) -> int:
    live = 0
    for e in events:
        if (e.step, e.phase) == (step, phase):
            return live
        live += e.nbytes
    raise AssertionError(f"no {phase} in step {step}")


def test_the_compiling_step_leaves_nothing_in_the_measured_steps():
    """Compiling from fake tensors keeps tensors the compiled graphs were made from alive (GPT-2's logits, which
    its loss function's graph takes; a real compile does not): the compiling step runs unrecorded, so each
    measured step starts with the same live bytes (SGD keeps no state, the gradients are freed). Without it the
    second step starts with the first's logits still counted."""
    from engine.trace.tracer import trace_model

    src = MODEL.replace(":chains", ":tiny_gpt2")
    trace, info = trace_model(resolve_source(src), TrainConfig(batch_size=4, optimizer="sgd", device="cpu",
                                                               compile=True))
    assert any("graphs compiled" in n for n in info.notes)
    assert _live_at(trace.events, 1, "forward") == _live_at(trace.events, 0, "forward")


def test_unmodelled_modes_and_generation_are_refused_in_one_line(capsys):
    for mode in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        with pytest.raises(UserError, match=f"torch.compile mode '{mode}' is not modelled"):
            TrainConfig(compile=mode)
    assert TrainConfig(compile="default") == TrainConfig(compile=True)
    with pytest.raises(UserError, match="unknown torch.compile mode 'fast'"):
        TrainConfig(compile="fast")
    with pytest.raises(UserError, match="generation under torch.compile is not modelled"):
        TrainConfig(mode="generate", compile=True)
    rc = entry.main(["estimate", MODEL, "--compile", "--compile-mode", "reduce-overhead", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "reduce-overhead" in err
    rc = entry.main(["estimate", MODEL, "--compile-mode", "default"])
    out, err = capsys.readouterr()
    assert rc == 2 and err.strip() == "error: --compile-mode: chooses torch.compile's mode; add --compile"


def test_the_config_round_trips_and_old_files_are_eager():
    cfg = TrainConfig(batch_size=4, compile=True)
    assert cfg.to_json()["compile"] is True
    assert TrainConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    old = {k: v for k, v in cfg.to_json().items() if k != "compile"}  # a file saved before --compile
    assert TrainConfig.from_json(old).compile is False and TrainConfig.from_json(old).program == "eager"


def test_the_cli_flag_estimates_the_compiled_step_and_says_so(capsys):
    """A CUDA target gets inductor's CPU plan (the same live tensors here: no CPU kernel scratch in this model),
    marked modelled; the CLI's summary and the report name the program."""
    rc = entry.main(["estimate", MODEL, "--batch-size", "256", "--optimizer", "adamw", "--gpu", "A100 80GB",
                     "--compile", "--json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    d = json.loads(out)
    assert d["config"]["compile"] is True and d["peak_bytes"] == _compiled_estimate().peak_bytes
    assert any("inductor's buffer plan for the CPU" in m for m in d["extra"]["modelled"])
    from cli.estimate import render_summary
    from report.content import config_rows

    text = render_summary(_compiled_estimate())
    assert "Program     compiled (torch.compile, inductor, default mode)" in text
    assert dict(config_rows(_compiled_estimate()))["Program"].startswith("compiled")
    eager = estimate(resolve_source(MODEL), TRAIN)
    assert "Program     eager" in render_summary(eager) and dict(config_rows(eager))["Program"] == "eager"


def test_the_panel_checkbox_sets_compile(qtbot):
    from gui.config_panel import ConfigPanel

    panel = ConfigPanel()
    qtbot.addWidget(panel)
    assert panel.config().compile is False
    panel.compile.setChecked(True)
    assert panel.config().compile is True
    panel.mode.setCurrentIndex(panel.mode.findData("generate"))
    assert not panel.compile.isEnabled() and panel.config().compile is False  # generation is modelled eager


def test_the_app_summary_says_compiled(qtbot):
    from gui.results.summary import SummaryView

    view = SummaryView()
    qtbot.addWidget(view)
    view.set_estimate(_compiled_estimate())
    assert view.where.text().endswith("— compiled (torch.compile)")
    view.set_estimate(estimate(resolve_source(MODEL), TRAIN))
    assert "compiled" not in view.where.text()


def test_the_python_api_takes_compile():
    import vramscope
    from tests.fixtures.compile_models import chains

    model, x = chains(256)
    est = vramscope.estimate(model, x, optimizer="adamw", device="cpu", compile=True)
    assert est.config.program == "compiled" and est.peak_bytes == _compiled_estimate().peak_bytes
    with pytest.raises(vramscope.UserError, match="torch.compile mode 'max-autotune' is not modelled"):
        vramscope.estimate(model, x, device="cpu", compile="max-autotune")
