"""Issue 26's remaining classes, each at the depth it belongs: snapshots (a pipe, a gzip CRC), LoRA options,
recordings the exporter replays, the exporter's port, a sketch node id. One line, exit 2, nothing hangs."""

from __future__ import annotations

import gzip
import json
import os
import threading
from pathlib import Path

import pytest

from engine.core.errors import UserError
from engine.monitor.exporter import parse_listen
from engine.monitor.recording import load_recording
from engine.sketch.document import Sketch
from engine.snapshots.file import load_snapshot_file
from main import main

DATA = Path(__file__).parent / "data"
SNAPSHOT = DATA / "resnet18-b8-adam.pickle.gz"
RECORDING = DATA / "h200-monitor-excerpt.jsonl"
SKETCH = str(Path(__file__).parent.parent / "resources" / "templates" / "mlp.json")


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# -- snapshots ----------------------------------------------------------------------------------------------

def test_a_snapshot_that_is_a_pipe_is_refused_without_blocking(tmp_path):
    pipe = tmp_path / "snap.pickle"
    os.mkfifo(pipe)
    done = threading.Event()

    def unblock() -> None:  # should the reader block on it, it gets an empty pipe (and the test fails)
        while not done.wait(2):
            os.close(os.open(pipe, os.O_RDWR | os.O_NONBLOCK))
    threading.Thread(target=unblock, daemon=True).start()
    try:
        with pytest.raises(UserError, match="a named pipe, not a snapshot file"):
            load_snapshot_file(pipe)
    finally:
        done.set()


def test_a_snapshot_with_a_bad_gzip_crc_is_refused(tmp_path):
    raw = bytearray(SNAPSHOT.read_bytes())
    raw[-8] ^= 0xFF  # the CRC32 in the gzip trailer: the data itself decompresses whole
    bad = tmp_path / "bad-crc.pickle.gz"
    bad.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="cut short or corrupt .*fails its CRC"):
        load_snapshot_file(bad)
    assert isinstance(load_snapshot_file(SNAPSHOT), dict)  # the whole file still opens


def test_open_refuses_a_negative_top(capsys):
    assert "--top" in _one_line_exit_2(capsys, ["open", str(SNAPSHOT), "--top", "-1"])


# -- LoRA options -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, words", [
    (["--peft", "lora", "--lora-rank", str(2**62)], "LoRA rank must be a whole number from 1 to 1,048,576"),
    (["--peft", "lora", "--lora-rank", str(10**30)], "LoRA rank must be a whole number from 1 to 1,048,576"),
    (["--peft", "lora", "--lora-alpha", str(2**62)], "LoRA alpha must be a whole number from 1 to 1,048,576"),
    (["--peft", "lora", "--lora-targets", ",,,"], "--lora-targets: ',,,' names no layer"),
    (["--peft", "lora", "--lora-targets", ""], "--lora-targets: '' names no layer"),
    (["--peft", "lora", "--lora-targets", "   "], "names no layer"),
    (["--lora-targets", "q_proj"], "--lora-targets: chooses where LoRA adapters go; add --peft lora"),
])
def test_lora_options_that_cannot_be_modelled_are_one_line(capsys, extra, words):
    err = _one_line_exit_2(capsys, ["estimate", "gpt2", "--batch-size", "1", "--seq-len", "8", *extra])
    assert words in err


# -- recordings the exporter replays, and its port ----------------------------------------------------------

def _recording(tmp_path: Path, change: dict[str, object], where: str = "gpu") -> Path:
    lines = [json.loads(line) for line in RECORDING.read_text().splitlines() if line.strip()]
    sample = next(d for d in lines if "time" in d and d.get("gpus"))
    if where == "gpu":
        sample["gpus"][0].update(change)
    elif where == "process":
        sample["gpus"][0]["processes"] = [change]
    else:
        sample.update(change)
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(sample) + "\n")
    return p


@pytest.mark.parametrize("change, where, words", [
    ({"memory_used": "a lot"}, "gpu", "'memory_used' is 'a lot', not a whole number"),
    ({"memory_used": True}, "gpu", "'memory_used' is True, not a whole number"),
    ({"memory_used": 2**70}, "gpu", "not a whole number"),
    ({"gpu_index": 0, "used_bytes": 5}, "process", "a ProcessInfo without 'pid'"),
    ({"processes": {"pid": 1}}, "gpu", "'processes' is dict, not a list"),
    ({"mig_devices": "none"}, "gpu", "'mig_devices' is str, not a list"),
    ({"unavailable": ["x"]}, "gpu", "'unavailable' is list, not an object"),
    ({"gpus": {"0": {}}}, "snapshot", "'gpus' is dict, not a list"),
    ({"gpus": ["GPU 0"]}, "snapshot", "a GpuSnapshot is str, not an object"),
])
def test_a_recording_of_the_wrong_shape_is_one_line_before_it_is_served(tmp_path, capsys, change, where, words):
    p = _recording(tmp_path, change, where)
    with pytest.raises(UserError, match="r.jsonl line 1: not a monitor snapshot") as e:
        load_recording(p)
    assert words in str(e.value)
    err = _one_line_exit_2(capsys, ["monitor", "--serve-metrics", "127.0.0.1:0", "--replay", str(p),
                                    "--duration", "1"])
    assert words in err


@pytest.mark.parametrize("text", ["٣", "9400٣", "۹۴۰۰", "localhost:٣"])
def test_serve_metrics_takes_ascii_digits_only(text):
    with pytest.raises(UserError, match="give a port"):
        parse_listen(text)


# -- a sketch node id ---------------------------------------------------------------------------------------

def test_a_node_id_ending_in_a_newline_is_refused(tmp_path, capsys):
    with pytest.raises(UserError, match="must be a Python-style name"):
        Sketch().add_node("Linear", {"out_features": 4}, id="fc\n")
    d = json.loads(Path(SKETCH).read_text())
    old = d["nodes"][1]["id"]
    d["nodes"][1]["id"] = old + "\n"
    for e in d["edges"]:
        for k in ("src", "dst"):
            if e[k] == old:
                e[k] = old + "\n"
    p = tmp_path / "nl.json"
    p.write_text(json.dumps(d))
    assert "must be a Python-style name" in _one_line_exit_2(capsys, ["estimate", str(p)])


def test_a_gzip_of_op_records_still_reads(tmp_path):
    from engine.cuda.gpu_profile import read_ops

    rows = read_ops(DATA / "h200-kernel-ops.jsonl.gz")
    assert rows and all(isinstance(r, dict) for r in rows)
    plain = tmp_path / "ops.jsonl"
    plain.write_bytes(gzip.decompress((DATA / "h200-kernel-ops.jsonl.gz").read_bytes()))
    assert read_ops(plain) == rows
