"""Issue 12: huge numbers, impossible parallelism and contradicting options are one line with exit 2 (never a
traceback, a hang or a silent exit 0); gradient accumulation of any length is traced in the time of two
micro-steps; the CLI's numeric options survive anything hypothesis types into them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import main as entry
from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.core.units import format_bytes
from engine.models.sources import TemplateSource, resolve_source
from engine.models.templates import TEMPLATES, gpt2
from engine.planning.estimator import estimate
from engine.trace.tracer import trace_model

FIX = Path(__file__).resolve().parent / "fixtures"
TINY = f"{FIX / 'cli_models.py'}:tiny"


def run(capsys, *argv) -> tuple[int, str, str]:
    try:
        rc = entry.main(list(argv))
    except SystemExit as e:  # argparse's own mistakes
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(capsys, *argv) -> str:
    rc, _out, err = run(capsys, *argv)
    assert rc == 2, (argv, rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv, expected", [
    (["estimate", "resnet18", "--batch-size", "1000000000000"], "too large to model"),
    (["plan", "resnet18", "--batch-size", "1000000000000"], "too large to model"),
    (["estimate", "resnet18", "--batch-size", "1" + "0" * 20], "batch size 1" + "0" * 20 + " is too large"),
    (["estimate", "resnet18", "--image-size", "1000000000000"], "image size 1000000000000 is too large"),
    (["estimate", TINY, "--batch-size", "1e20"], "--batch-size"),
    (["estimate", TINY, "--world-size", "99999999999999999999", "--tp", "1"], "world size"),
    (["max-batch", TINY, "--budget", "1e300"], "--budget: the budget 1e+300 GiB is too large"),
])
def test_huge_numbers_are_one_line(capsys, argv, expected):
    assert expected in one_line_error(capsys, *argv)


def test_a_huge_step_names_the_setting_to_lower():
    with pytest.raises(UserError, match=r"lower the batch size \(1000000000000\)"):
        estimate(resolve_source("resnet18"), TrainConfig(batch_size=10**12))


def test_format_bytes_never_raises():
    assert format_bytes(2**62) == "4.00 EiB"
    assert format_bytes(4096 * 2**40) == "4.00 PiB"
    assert "e+381 EiB" in format_bytes(10**400) and format_bytes(-(10**400)).startswith("-")
    assert format_bytes(float("nan")) == "n/a" and "∞" in format_bytes(float("inf"))


@pytest.mark.parametrize("argv, expected", [
    (["estimate", "gpt2", "--world-size", "8", "--tp", "8"], "--tp 8: does not divide the 12 attention heads"),
    (["estimate", "gpt2", "--world-size", "2048", "--tp", "1024"], "--tp 1024: does not divide"),
    (["estimate", "llama-7b", "--world-size", "3", "--tp", "3"], "does not divide the 32 attention heads"),
    (["estimate", "llama-70b", "--world-size", "16", "--tp", "16"], "does not divide the 8 KV heads"),
    (["estimate", "resnet18", "--world-size", "4", "--tp", "4"], "resnet18 has no attention layer"),
])
def test_impossible_tensor_parallelism_is_refused(capsys, argv, expected):
    assert expected in one_line_error(capsys, *argv)


def test_a_shard_of_less_than_one_parameter_per_rank_is_refused(capsys):
    msg = one_line_error(capsys, "estimate", TINY, "--device", "cpu", "--world-size", "4096", "--strategy", "zero3")
    assert "--world-size 4096: zero3 over 4096 ranks would give each rank less than one" in msg
    rc, _, _ = run(capsys, "estimate", TINY, "--device", "cpu", "--world-size", "1024", "--strategy", "zero3")
    assert rc == 0  # 2,762 parameters over 1,024 ranks: small shards, but shards


def test_possible_tensor_parallelism_still_runs(capsys):
    rc, out, _ = run(capsys, "estimate", "gpt2", "--world-size", "8", "--tp", "4", "--seq-len", "64", "--json")
    assert rc == 0 and '"peak_bytes"' in out


@pytest.mark.parametrize("argv, expected", [
    (["--mode", "inference", "--optimizer", "sgd"], "--mode inference: --optimizer only applies to training"),
    (["--mode", "inference", "--grad-accum", "4"], "--grad-accum only applies to training"),
    (["--mode", "inference", "--checkpointing"], "--checkpointing only applies to training"),
    (["--optimizer", "none", "--fused"], "--optimizer none: --fused needs an optimizer"),
    (["--device", "cpu", "--gpu", "A100 80GB"], "--device cpu: --gpu 'A100 80GB'"),
    (["--gpu", ""], "--gpu: is empty"),
    (["-o", ""], "-o: is an empty file name"),
    (["--top", "-5"], "--top: must be 0 or more"),
])
def test_contradicting_or_empty_options_are_refused(capsys, argv, expected):
    assert expected in one_line_error(capsys, "estimate", TINY, *argv)


def test_monitor_interval_inf_is_not_a_finite_number(capsys):
    assert "not a finite number" in one_line_error(capsys, "monitor", "--interval", "inf")
    assert "finite" in one_line_error(capsys, "monitor", "--duration", "inf")


def _gpt2_two_blocks() -> TemplateSource:
    """GPT-2 as the gpt2 template builds it (tied LM head, next-token loss) with two blocks instead of twelve: the
    blocks are alike, so ten more cost the accumulation check a minute and add no case to it."""
    return TemplateSource(replace(TEMPLATES["gpt2"], name="gpt2-2-blocks",
                                  build=gpt2.builder(gpt2.GPT2Config(layers=2), "gpt2-2-blocks")))


@pytest.mark.parametrize("source, device", [(lambda: resolve_source(TINY), "cpu"),
                                            (lambda: resolve_source("resnet18"), "cuda"), (_gpt2_two_blocks, "cpu")],
                         ids=["tiny-cpu", "resnet18-cuda", "gpt2-2-blocks-cpu"])
def test_grad_accum_copies_equal_a_trace_of_every_micro_step(source, device):
    src = source()
    for k in (3, 5):
        seq_len = 32 if src.name == "gpt2-2-blocks" else None
        cfg = TrainConfig(grad_accum=k, device=device, batch_size=2, seq_len=seq_len)
        modelled, _ = trace_model(src, cfg)
        real, _ = trace_model(src, cfg, every_micro_step=True)

        def rows(t):
            return [(e.nbytes, e.step, e.phase, e.module, e.op, e.category) for e in t.events]

        assert rows(modelled) == rows(real)
        if device == "cuda":
            a, b = estimate(src, cfg), estimate(src, cfg)
            assert a.gpu.reserved_bytes == b.gpu.reserved_bytes


def test_a_trillion_micro_steps_take_the_time_of_eight(capsys):
    rc, out, _ = run(capsys, "estimate", TINY, "--device", "cpu", "--grad-accum", "1000000000000", "--json")
    assert rc == 0
    import json

    d = json.loads(out)
    eight = estimate(resolve_source(TINY), TrainConfig(device="cpu", grad_accum=8))
    assert d["peak_bytes"] == eight.peak_bytes
    assert any("1,000,000,000,000 micro-steps" in n for n in d["notes"])


NUMERIC = ["--batch-size", "--seq-len", "--image-size", "--grad-accum", "--world-size", "--tp", "--top"]
values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["0", "-1", "1e20", "inf", "nan", "", " ", "1_000", "0x10", "9" * 5000, "2**62", "1.5"]),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text(max_size=12),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(NUMERIC), value=values)
def test_numeric_options_give_a_result_or_one_line(capsys, option, value):
    rc, out, err = run(capsys, "estimate", TINY, "--device", "cpu", "--mode", "train", option, value, "--json")
    assert rc in (0, 2), (option, value, rc, err[-2000:])
    assert "Traceback" not in err
    if rc == 2:
        assert len(err.strip().splitlines()) == 1, err[-2000:]
    else:
        assert out.lstrip().startswith("{")


@pytest.mark.parametrize("options", [["--world-size", "8", "--tp", "4"], ["--world-size", "8", "--strategy", "zero3"]])
def test_the_nvidia_smi_split_adds_up_per_rank(capsys, options):
    rc, out, _ = run(capsys, "estimate", "gpt2", "--seq-len", "64", *options)
    assert rc == 0
    block = out.split("by category")[1].split("\n\n")[0]
    shares = [float(line.split()[-2]) for line in block.strip().splitlines() if line.rstrip().endswith("%")]
    assert abs(sum(shares) - 100.0) < 0.5, block
