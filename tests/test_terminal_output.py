"""Escape sequences and forged lines in terminal output (issue 26): every name the CLI prints from a file, a server
or the user (model and file names, GPU names, layer names and frames from snapshots, Prometheus labels, process
commands) goes through cli.terminal: control characters are written escaped, a newline cannot start a line."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import pytest

import main as entry
from cli.fleet import format_fleet
from cli.monitor import format_table
from cli.terminal import shown, terminal_text
from engine.monitor.prometheus import FleetSnapshot
from engine.monitor.samples import GpuSnapshot, ProcessInfo, Snapshot

DATA = Path(__file__).parent / "data"
HOSTILE = "evil\x1b[2J\x1b]0;pwned\x07\nerror: forged line\r\u202edcba\u2028x"
ESCAPED = r"evil\x1b[2J\x1b]0;pwned\x07\nerror: forged line\r\u202edcba\u2028x"


def _clean(text: str) -> None:
    """No control character but the line breaks, and no line that the hostile name began."""
    assert not [ch for ch in text if (ord(ch) < 0x20 and ch not in "\n\t") or 0x7F <= ord(ch) < 0xA0
                or ch in "\u202e\u2028"]
    assert not [ln for ln in text.splitlines() if ln.startswith("error: forged")]


def test_shown_escapes_every_control_character_and_keeps_the_rest():
    assert shown(HOSTILE) == ESCAPED
    assert shown("layers.0–31.mlp ×32 Ünïcode 東京 (1/2)") == "layers.0–31.mlp ×32 Ünïcode 東京 (1/2)"
    assert shown("\x00\x7f\x9b\t") == r"\x00\x7f\x9b\t"
    assert terminal_text("a\tb\nc\x1b[31md\n") == "a\tb\nc\\x1b[31md\n"


def test_a_hostile_name_in_an_error_line_stays_one_line(capsys):
    assert entry.main(["estimate", HOSTILE]) == 2
    err = capsys.readouterr().err
    _clean(err)
    assert err.count("\n") == 1 and ESCAPED in err


def test_a_hostile_option_value_in_a_usage_error_stays_one_line(capsys):
    with pytest.raises(SystemExit):
        entry.main(["estimate", "gpt2", "--batch-size", HOSTILE])
    err = capsys.readouterr().err
    _clean(err)
    assert err.count("\n") == 1


def test_snapshot_frames_and_paths_cannot_forge_lines(tmp_path, capsys):
    data = pickle.loads(gzip.decompress((DATA / "resnet50-b256-oom-at-4gib.pickle.gz").read_bytes()))
    for trace in data["device_traces"]:
        for e in trace:
            for f in e.get("frames") or ():
                f["name"] = HOSTILE
    p = tmp_path / "snap\x1b[31m.pickle"
    p.write_bytes(pickle.dumps(data))
    assert entry.main(["open", str(p)]) == 0
    out = capsys.readouterr().out
    assert "OUT OF MEMORY" in out and ESCAPED in out and r"snap\x1b[31m.pickle" in out
    _clean(out)


def test_monitor_tables_escape_gpu_names_labels_and_commands():
    g = GpuSnapshot(index=0, name=HOSTILE, memory_total=80 << 30, memory_used=1 << 30, host=HOSTILE, host_gpu=0,
                    labels=(("hpc_job", HOSTILE),),
                    processes=(ProcessInfo(pid=7, gpu_index=0, used_bytes=1 << 20, user=HOSTILE, command=HOSTILE),))
    local = terminal_text(format_table(Snapshot(time=0.0, gpus=(g,), driver_version=HOSTILE)))
    fleet = terminal_text(format_fleet(FleetSnapshot(time=0.0, gpus=(g,), server="http://p:9090",
                                                     targets_down=(HOSTILE,), families=("dcgm-exporter",))))
    for text in (local, fleet):
        _clean(text)
        assert r"evil\x1b[2J" in text


from hypothesis import given, settings, strategies as st  # noqa: E402

from engine.core.failure_text import failure_text  # noqa: E402


def _control(ch: str) -> bool:
    return not ch.isprintable() and ch != " "


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_name_is_shown_on_one_line_without_a_control_character(text):
    s = shown(text)
    assert not any(_control(ch) for ch in s)
    assert shown(s) == s  # once is enough: what it writes is printable
    block = f"Model       {s}\nnext line"  # a rendered block: its fields through shown()
    assert terminal_text(block) == block and block.count("\n") == 1
    raw = terminal_text(f"Model       {text}\nnext line")  # a field that missed shown(): its newlines stay,
    assert not any(_control(ch) for ch in raw if ch not in "\n\t")  # but no escape sequence gets through


@settings(max_examples=200, deadline=None)
@given(st.text(), st.one_of(st.none(), st.text()),
       st.sampled_from([KeyError, TypeError, ValueError, IndexError, OSError, RuntimeError, RecursionError]))
def test_any_failure_is_one_line_of_at_most_300_characters(message, subject, kind):
    text = failure_text(kind(message), subject)
    assert 0 < len(text) <= 300 and not any(_control(ch) for ch in text)
    assert not text.startswith(kind.__name__)
