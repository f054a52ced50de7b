"""`vramscope diff A B` and its Python forms (`vramscope.diff`, `vramscope.testing.assert_peak_within`) on real
estimates written by `vramscope estimate -o` and on a real run's snapshot."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import main as entry
import vramscope
from engine.core.units import format_bytes
from vramscope.testing import assert_peak_within

SNAPSHOT = Path(__file__).parent / "data" / "resnet18-b8-adam.pickle.gz"


@pytest.fixture(scope="module")
def estimates(tmp_path_factory):
    """Three estimate files written by the CLI: a small convnet at batch 4, at batch 8, and at batch 4 on a GPU."""
    d = tmp_path_factory.mktemp("diff")
    f = d / "convnet.py"
    f.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def build(batch_size):
            model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
            return model, torch.randn(batch_size, 3, 32, 32)
    """))
    out = {}
    for name, extra in (("b4", ["--batch-size", "4", "--device", "cpu"]),
                        ("b8", ["--batch-size", "8", "--device", "cpu"]),
                        ("gpu", ["--batch-size", "4", "--gpu", "A100 80GB"]),
                        ("gpu-b8", ["--batch-size", "8", "--gpu", "A100 80GB"])):
        out[name] = d / f"{name}.json"
        assert entry.main(["estimate", f"{f}:build", "--optimizer", "adam", "-o", str(out[name]), *extra]) == 0
    return out


def run(capsys, *argv):
    code = entry.main(["diff", *map(str, argv)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_diff_shows_the_figures_of_both_files_and_names_the_configuration_change(estimates, capsys):
    code, out, err = run(capsys, estimates["b4"], estimates["b8"])
    assert code == 0 and err == ""
    a, b = (json.loads(estimates[k].read_text()) for k in ("b4", "b8"))
    peak = next(line for line in out.splitlines() if line.strip().startswith("peak"))
    assert format_bytes(a["peak_bytes"]) in peak and format_bytes(b["peak_bytes"]) in peak
    pct = 100 * (b["peak_bytes"] - a["peak_bytes"]) / a["peak_bytes"]
    assert f"({pct:+.1f} %)" in peak
    acts = next(line for line in out.splitlines() if line.strip().startswith("activations"))
    assert format_bytes(b["breakdown_at_peak"]["activations"]) in acts
    assert "Configuration: batch_size 4 -> 8" in out
    assert "Modules that changed most" in out


def test_fail_over_exits_1_saying_what_grew_and_0_within_the_limit(estimates, capsys):
    a, b = (json.loads(estimates[k].read_text()) for k in ("b4", "b8"))
    pct = 100 * (b["peak_bytes"] - a["peak_bytes"]) / a["peak_bytes"]
    assert pct > 10
    code, _out, err = run(capsys, estimates["b4"], estimates["b8"], "--fail-over", "10")
    assert code == 1
    assert err.strip() == (f"memory guard: peak grew +{pct:.1f} % ({format_bytes(a['peak_bytes'])} -> "
                           f"{format_bytes(b['peak_bytes'])}), more than the 10 % allowed")
    assert run(capsys, estimates["b4"], estimates["b8"], "--fail-over", f"{pct + 0.5:.1f}")[0] == 0
    assert run(capsys, estimates["b8"], estimates["b4"], "--fail-over", "0")[0] == 0  # it shrank


def test_the_guard_watches_reserved_memory_too(estimates, capsys, tmp_path):
    """A step whose live tensors stay the same but whose allocator reserve grows (here B's reserve raised by hand
    in a real estimate file) fails the guard on the reserved figure."""
    a = json.loads(estimates["gpu"].read_text())
    b = json.loads(estimates["gpu"].read_text())
    b["gpu"]["reserved_bytes"] = int(a["gpu"]["reserved_bytes"] * 1.2)
    bf = tmp_path / "b.json"
    bf.write_text(json.dumps(b))
    code, out, err = run(capsys, estimates["gpu"], bf, "--fail-over", "5")
    assert code == 1 and err.startswith("memory guard: reserved grew +20.0 %") and "peak" not in err
    assert "reserved" in out and "nvidia-smi" in out


def test_json_output_and_the_python_call_agree(estimates, capsys):
    code, out, _err = run(capsys, estimates["gpu"], estimates["gpu-b8"], "--json", "--fail-over", "1000")
    data = json.loads(out)
    assert code == 0 and data["failed"] == []
    d = vramscope.diff(estimates["gpu"], estimates["gpu-b8"])
    assert data["headline"] == d.to_json()["headline"]
    names = [r["name"] for r in data["headline"]]
    assert names == ["peak", "reserved", "nvidia-smi"]
    assert str(d) == d.text() and "batch_size 4 -> 8" in str(d)


def test_a_snapshot_pickle_diffs_as_an_estimate(capsys):
    code, out, _err = run(capsys, SNAPSHOT, SNAPSHOT, "--fail-over", "0")
    assert code == 0
    assert "Configuration: the same" in out and "+" not in out.split("Configuration")[0].split("change")[1]


@pytest.mark.parametrize("content, message", [
    (None, "not found"),
    ("{not json", "is not valid JSON (line 1"),
    ('{"hello": 1}', "is not a VRAMScope estimate (it has no peak_bytes)"),
    ('{"peak_bytes": 5}', "is not a complete VRAMScope estimate (missing 'model_name')"),
    (b"\x80\x04K\x05.", "is a pickle but not a PyTorch memory snapshot"),
    (b"\xff\xfe\x00garbage", "is neither JSON nor a snapshot pickle"),
])
def test_bad_files_are_one_line_and_exit_2(estimates, capsys, tmp_path, content, message):
    bad = tmp_path / "bad.json"
    if isinstance(content, str):
        bad.write_text(content)
    elif isinstance(content, bytes):
        bad.write_bytes(content)
    code, out, err = run(capsys, estimates["b4"], bad)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_bad_limits_are_one_line(estimates, capsys):
    code, _out, err = run(capsys, estimates["b4"], estimates["b8"], "--fail-over", "-3")
    assert code == 2 and err == "error: --fail-over: must be 0 or more per cent, got -3\n"


def test_assert_peak_within_passes_fails_and_writes_its_baseline(estimates, tmp_path):
    from engine.planning.diff import load_estimate

    b4, b8 = load_estimate(estimates["b4"]), load_estimate(estimates["b8"])
    base = tmp_path / "baseline.json"
    with pytest.raises(AssertionError, match="memory baseline .* not found: write it once with"):
        assert_peak_within(b4, base)
    assert_peak_within(b4, base, update=True)
    assert json.loads(base.read_text())["peak_bytes"] == b4.peak_bytes
    assert_peak_within(b4, base, percent=0)
    with pytest.raises(AssertionError, match=r"memory grew: peak grew \+\d+\.\d %") as err:
        assert_peak_within(b8, base, percent=5)
    assert "batch_size 4 -> 8" in str(err.value)
    assert_peak_within(b4, b8, percent=0)  # smaller than the baseline


def test_two_of_the_users_steps_name_what_differs_in_the_step():
    import torch
    from torch import nn

    def setup():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
        return model, torch.randn(16, 32)

    def sgd_step(model, opt, x):
        model(x).square().mean().backward()
        opt.step()

    model, x = setup()
    a = vramscope.estimate_step(sgd_step, model, torch.optim.SGD(model.parameters(), lr=0.1), x, device="cpu")
    b = vramscope.estimate_step(sgd_step, model, torch.optim.Adam(model.parameters()), x, device="cpu")
    d = vramscope.diff(a, b)
    assert ("step optimizers", "opt (SGD)", "opt (Adam)") in d.config and ("optimizer", "sgd", "adam") in d.config
    assert d.grew(10) and d.grew(10)[0].startswith("peak grew +")
    state = next(r for r in d.categories if r.name == "optimizer_state")
    assert state.a == 0 and state.b == 2 * 4 * sum(p.numel() for p in model.parameters()) + 4 * 4
