"""The one bounded reader behind every JSON and file the project reads (engine/core/bounded_read.py): size, nesting,
numbers, pipes and devices; and the readers that use it, each failing in one line (exit 2) and never hanging.
A bad file in the profiles folder costs only itself."""

from __future__ import annotations

import gzip
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from engine.core.bounded_read import MAX_DEPTH, parse_json, read_bytes, read_json
from engine.core.errors import UserError
from engine.cuda import gpu_profile as gp
from engine.monitor.recording import load_recording
from engine.sketch.document import Sketch
from main import main

H200 = Path(__file__).parent.parent / "resources" / "gpu_profiles" / "nvidia-h200.json"
DEEP = "[" * 100_000 + "]" * 100_000  # 200 KB


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = tmp_path / "data"
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(d))
    gp.reload_profiles()
    yield d
    gp.reload_profiles()


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A named pipe. Should a reader block on it, a writer opens and closes it every 2 s: the test then ends
    (and fails on its message) instead of hanging."""
    p = tmp_path / "pipe.json"
    os.mkfifo(p)
    done = threading.Event()

    def unblock() -> None:
        while not done.wait(2):
            os.close(os.open(p, os.O_RDWR | os.O_NONBLOCK))
    t = threading.Thread(target=unblock, daemon=True)
    t.start()
    yield p
    done.set()
    t.join(10)


# -- issue 27 item 8: a sketch nested 100,000 deep ----------------------------------------------------------

def test_a_sketch_nested_100000_deep_is_one_line_again(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    err = _one_line_exit_2(capsys, ["estimate", str(deep)])
    assert "deep.json: nested too deeply" in err
    err = _one_line_exit_2(capsys, ["estimate", str(tmp_path / "config.json")])  # a missing HF config: one line
    assert "not found" in err


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 500, 5_000, 100_000])
def test_nesting_past_the_limit_is_one_line_at_any_depth(depth):
    for text in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
        with pytest.raises(UserError, match="nested too deeply"):
            parse_json(text, "x.json")
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x.json") is not None


@pytest.mark.parametrize("text, words", [
    ("[1e400]", "too large to be a number"), ("[-Infinity]", "-Infinity, which JSON does not allow"),
    ("[NaN]", "NaN, which JSON does not allow"), ("[" + "9" * 5000 + "]", "too long to read (5,000 digits"),
    ("[1." + "5" * 200 + "]", "too long to read (202 characters"), ("{bad", "not valid JSON (line 1, column 2"),
    (b"\x89PNG\r\n\x1a\n\x00", "not UTF-8 text"),
])
def test_numbers_and_bytes_json_does_not_hold_are_one_line(text, words):
    with pytest.raises(UserError, match="x.json: .*") as e:
        parse_json(text, "x.json")
    assert words in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.one_of(st.text(max_size=80), st.binary(max_size=80),
                 st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
                              | st.integers() | st.text(max_size=5),
                              lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids,
                                                                                          max_size=3),
                              max_leaves=20).map(json.dumps)))
def test_the_parser_answers_data_or_one_line_for_any_text(text):
    try:
        data = parse_json(text, "x.json")
    except UserError as e:
        assert str(e).startswith("x.json: ") and "\n" not in str(e)
    else:
        assert json.loads(text) == data or data != data


# -- pipes, devices, sizes ----------------------------------------------------------------------------------

def test_a_named_pipe_is_refused_by_every_reader_without_blocking(fifo, capsys, data_dir):
    for read in (lambda: Sketch.load(fifo), lambda: read_json(fifo), lambda: load_recording(fifo),
                 lambda: gp.load_profile(fifo), lambda: gp.read_ops(fifo)):
        with pytest.raises(UserError, match="a named pipe, not a"):
            read()
    for argv in (["estimate", str(fifo)], ["calibrate", "--import", str(fifo)],
                 ["calibrate", "--from-ops", str(fifo), "--gpu", "H200"]):
        assert "a named pipe" in _one_line_exit_2(capsys, argv)


def test_a_link_to_dev_zero_is_refused_before_reading(tmp_path, capsys):
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(UserError, match="zero.json: a device, not a file"):
        read_bytes(link)
    assert "a device, not a sketch" in _one_line_exit_2(capsys, ["estimate", str(link)])


def test_a_file_over_the_cap_is_refused_by_its_size(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(70 << 20)  # sparse: 70 MiB without writing them
    with pytest.raises(UserError, match=r"73,400,320 bytes, more than a JSON file holds \(67,108,864 at most\)"):
        read_json(big)
    with pytest.raises(UserError, match="more than a sketch file holds"):
        Sketch.load(big)


# -- calibration profiles -----------------------------------------------------------------------------------

def _h200(**change: object) -> str:
    d = json.loads(H200.read_text())
    for k, v in change.items():
        if k == "name":
            d["gpu"]["name"] = v
        else:
            d[k] = v
    return json.dumps(d)


@pytest.mark.parametrize("content, words", [
    (_h200(context_bytes=1e400).replace("1e400", "Infinity"), "Infinity, which JSON does not allow"),
    (_h200(context_bytes=1).replace('"context_bytes": 1', '"context_bytes": ' + "7" * 5000), "(5,000 digits"),
    (_h200(software=["cuda", "12.4"]), '"software" is list, not an object'),
    (_h200(software="cuda 12.4"), '"software" is str, not an object'),
    (_h200(name="NVIDIA H200\nforged line"), "is not one line"),
    (_h200(name="G" * 10_000), "at most 200 characters"),
    (_h200(context_bytes=-5), "-5 is not a size in bytes"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_a_hostile_profile_is_one_line(tmp_path, capsys, data_dir, content, words):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    err = _one_line_exit_2(capsys, ["calibrate", "--import", str(bad)])
    assert words in err and "bad.json" in err


def test_a_gzip_profile_and_unwritable_places_are_one_line(tmp_path, capsys, data_dir):
    gz = tmp_path / "h200.json"
    gz.write_bytes(gzip.compress(H200.read_bytes()))
    assert "not UTF-8 text" in _one_line_exit_2(capsys, ["calibrate", "--import", str(gz)])
    assert "cannot write /dev/full" in _one_line_exit_2(capsys, ["calibrate", "--export", "H200", "/dev/full"])
    data_dir.mkdir()
    (data_dir / "gpu_profiles").write_text("a file where the folder belongs")
    assert "is a file, not a folder" in _one_line_exit_2(capsys, ["calibrate", "--import", str(H200)])


def test_one_binary_profile_in_the_folder_costs_only_itself(data_dir, capsys):
    folder = data_dir / "gpu_profiles"
    folder.mkdir(parents=True)
    (folder / "broken.json").write_bytes(bytes(range(256)) * 4)
    (folder / "mine.json").write_text(_h200(source="my own calibration"))
    gp.reload_profiles()
    assert main(["calibrate", "--list"]) == 0
    out, err = capsys.readouterr()
    assert "[user] NVIDIA H200" in out and "[built-in] NVIDIA H200" in out
    assert "[skipped]" in err and "broken.json: not a GPU profile (not UTF-8 text" in err
    prof = gp.profile_for("H200")
    assert prof is not None and prof.source == "my own calibration"  # estimates for that GPU still use it


def test_op_records_missing_fields_and_a_nan_context_are_one_line(tmp_path, capsys, data_dir):
    ops = tmp_path / "ops.jsonl"
    ops.write_text('{"case": "x"}\n{"op": "aten.mm.default", "in": [], "before": 0}\n')
    err = _one_line_exit_2(capsys, ["calibrate", "--from-ops", str(ops), "--gpu", "H200"])
    assert "ops.jsonl line 2: the record has no after, peak, out" in err
    ops.write_text('{"case": "x"}\n')
    for value in ("nan", "inf", "-1"):
        err = _one_line_exit_2(capsys, ["calibrate", "--from-ops", str(ops), "--gpu", "H200", "--context-mib", value])
        assert "--context-mib" in err


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.dictionaries(st.sampled_from(["kind", "version", "gpu", "software", "kernels", "context_bytes",
                                        "cublas_workspaces", "cases"]),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                                    | st.text(max_size=5), lambda k: st.lists(k, max_size=3)
                                    | st.dictionaries(st.sampled_from(["name", "compute_capability", "op", "in",
                                                                       "out", "scratch", "cuda"]), k, max_size=3),
                                    max_leaves=12)))
def test_any_profile_document_is_a_profile_or_one_line(doc):
    doc.setdefault("kind", "vramscope-gpu-profile")
    try:
        gp.GpuProfile.from_json(doc, where="p.json")
    except UserError as e:
        assert "\n" not in str(e)


# -- recordings ---------------------------------------------------------------------------------------------

_value = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
                      lambda k: st.lists(k, max_size=3) | st.dictionaries(
                          st.sampled_from(["index", "memory_used", "pid", "gpus", "processes", "mig_devices",
                                           "unavailable", "time", "name"]), k, max_size=3), max_leaves=12)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.dictionaries(st.sampled_from(["time", "gpus", "error", "driver_version"]), _value, max_size=4),
                min_size=1, max_size=4))
def test_any_recording_replays_or_is_one_line(tmp_path_factory, lines):
    p = tmp_path_factory.mktemp("rec") / "r.jsonl"
    p.write_text("\n".join(json.dumps(d) for d in lines) + "\n")
    try:
        load_recording(p)
    except UserError as e:
        assert "\n" not in str(e)
