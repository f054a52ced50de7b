"""Issue 12: user code that exits or prints, and `profile` of what cannot fit or does not run: one line and
exit 2 (never a silent 0 or 3), and --json stays one clean JSON object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import main as entry

FIX = Path(__file__).resolve().parent / "fixtures"
HOSTILE = FIX / "hostile_models.py"


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = entry.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(capsys, *argv) -> str:
    rc, out, err = run(capsys, *argv)
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("hello", "build says", "forward says"))]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, (rc, err)
    assert out == ""
    return lines[0]


@pytest.mark.parametrize("fn, code", [("exits_zero", "0"), ("exits_three", "3"), ("quits_in_forward", "0")])
@pytest.mark.parametrize("command", ["estimate", "max-batch", "profile"])
def test_sys_exit_in_user_code_is_an_error_not_a_status(capsys, fn, code, command):
    extra = ["--budget", "1"] if command == "max-batch" else []
    msg = one_line(capsys, command, f"{HOSTILE}:{fn}", "--device", "cpu", *extra)
    assert f"sys.exit({code})" in msg


def test_sys_exit_at_import_is_an_error(capsys):
    msg = one_line(capsys, "estimate", f"{FIX / 'exits_at_import.py'}:build", "--device", "cpu")
    assert "exits_at_import.py:5" in msg and "sys.exit(0)" in msg and "importing" in msg


@pytest.mark.parametrize("command, extra", [("estimate", []), ("max-batch", ["--budget", "0.001"]),
                                            ("profile", [])])
def test_prints_of_user_code_go_to_stderr_and_json_stays_clean(capsys, command, extra):
    rc, out, err = run(capsys, command, f"{HOSTILE}:chatty", "--device", "cpu", "--json", *extra)
    assert rc == 0, err
    json.loads(out)  # one JSON object, nothing else
    assert "build says hi" in err and "forward says hi" in err


@pytest.mark.parametrize("fn", ["raises_in_forward", "mismatch"])
def test_profile_gives_the_same_line_as_estimate_for_model_errors(capsys, fn):
    ref = f"{HOSTILE}:{fn}"
    a = one_line(capsys, "estimate", ref, "--device", "cpu")
    b = one_line(capsys, "profile", ref, "--device", "cpu")
    assert a == b


def test_profile_refuses_a_step_larger_than_free_memory(capsys):
    msg = one_line(capsys, "profile", "resnet18", "--device", "cpu", "--batch-size", "100000")
    assert msg.startswith("error: profile: the step needs about") and "free host memory" in msg


def test_profile_refusal_uses_the_estimate_and_free_memory(monkeypatch, capsys):
    import engine.planning.room

    monkeypatch.setattr(engine.planning.room, "available_host_memory", lambda: 1024)
    msg = one_line(capsys, "profile", f"{FIX / 'cli_models.py'}:tiny", "--device", "cpu")
    assert "(1.00 KiB)" in msg
