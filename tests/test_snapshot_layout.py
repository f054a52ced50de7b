"""A memory snapshot whose fields have the wrong types, validated once where the file is read: one line naming
the entry and field, exit 2 (AttributeError/TypeError/ValueError tracebacks before; the layout was checked at the
first and last trace entry only)."""

from __future__ import annotations

import copy
import gzip
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from engine.core.errors import UserError
from engine.snapshots.file import load_snapshot_file
from main import main

REAL = Path(__file__).parent / "data" / "resnet50-b256-oom-at-4gib.pickle.gz"  # small: 355 entries
_BASE = load_snapshot_file(REAL)


def _mid(d: dict[str, Any]) -> dict[str, Any]:
    trace = d["device_traces"][0]
    return trace[len(trace) // 2]  # neither the first nor the last: the old check never looked there


def _with_frame(d: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in d["device_traces"][0][len(d["device_traces"][0]) // 2:] if e.get("frames"))


MUTATIONS = {
    "an entry that is a string": (lambda d: d["device_traces"][0].__setitem__(5, "alloc"),
                                  "trace entry 5 of device 0 is str"),
    "a size that is a string": (lambda d: _mid(d).__setitem__("size", "512"), "'size' is '512', not a whole number"),
    "a size that is None": (lambda d: _mid(d).__setitem__("size", None), "lacks 'size'"),
    "a size that is NaN": (lambda d: _mid(d).__setitem__("size", float("nan")), "'size' is nan"),
    "a negative size": (lambda d: _mid(d).__setitem__("size", -1), "'size' is -1"),
    "a size of 2**63": (lambda d: _mid(d).__setitem__("size", 2**63), "'size' is 9223372036854775808"),
    "an infinite size": (lambda d: _mid(d).__setitem__("size", float("inf")), "'size' is inf"),
    "an action that is a list": (lambda d: _mid(d).__setitem__("action", ["alloc"]), "'action' is list, not text"),
    "no action": (lambda d: _mid(d).pop("action"), "lacks 'action'"),
    "frames a string": (lambda d: _with_frame(d).__setitem__("frames", "x.py:1"), "'frames' is 'x.py:1'"),
    "a frame a string": (lambda d: _with_frame(d)["frames"].__setitem__(0, "x.py"), "frame 0 is str"),
    "a frame's line a string": (lambda d: _with_frame(d)["frames"][0].__setitem__("line", "7"), "'line' is '7'"),
    "a segment a list": (lambda d: d["segments"].__setitem__(0, []), "segment 0 is list"),
    "blocks a string": (lambda d: d["segments"][0].__setitem__("blocks", "b"), "segment 0: 'blocks' is 'b'"),
    "a block's size negative": (lambda d: d["segments"][0]["blocks"][0].__setitem__("size", -5),
                                "segment 0, block 0: 'size' is -5"),
    "a total size NaN": (lambda d: d["segments"][0].__setitem__("total_size", float("nan")), "'total_size' is nan"),
    "annotations a dict": (lambda d: d.__setitem__("external_annotations", {"a": 1}), "'external_annotations' is dict"),
    "an annotation a string": (lambda d: d.__setitem__("external_annotations", ["START"]), "annotation 0 is str"),
    "settings a list": (lambda d: d.__setitem__("allocator_settings", ["x"]), "'allocator_settings' is list"),
    # present but None (benchmarks/hostile_probes found these: TypeError/AttributeError tracebacks, or taken)
    "a segment's address None": (lambda d: d["segments"][0].__setitem__("address", None),
                                 "segment 0: 'address' is None"),
    "a frame's filename None": (lambda d: _with_frame(d)["frames"][0].__setitem__("filename", None),
                                "'filename' is None, not text"),
    "a block's state None": (lambda d: d["segments"][0]["blocks"][0].__setitem__("state", None),
                             "segment 0, block 0: 'state' is None, not text"),
    "an entry's addr None": (lambda d: _mid(d).__setitem__("addr", None), "'addr' is None"),
}


def _write(tmp_path: Path, data: Any) -> Path:
    p = tmp_path / "snap.pickle.gz"
    p.write_bytes(gzip.compress(pickle.dumps(data, protocol=4)))
    return p


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_a_field_of_the_wrong_type_is_one_line_naming_it(tmp_path, capsys, name):
    data = copy.deepcopy(_BASE)
    change, words = MUTATIONS[name]
    change(data)
    p = _write(tmp_path, data)
    if words is None:  # a missing value: PyTorch leaves some out; it must still open, or be one line
        try:
            load_snapshot_file(p)
        except UserError as e:
            assert "\n" not in str(e)
        return
    with pytest.raises(UserError, match="the snapshot is damaged") as e:
        load_snapshot_file(p)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert main(["open", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err


_junk = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4),
                  st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(key=st.sampled_from(["size", "addr", "action", "frames", "time_us", "device_free"]), value=_junk,
       where=st.integers(min_value=0, max_value=10_000))
def test_any_value_in_any_entry_opens_or_is_one_line(key, value, where):
    from engine.snapshots.file import check_layout
    from engine.snapshots.reader import snapshot_estimate

    data = copy.deepcopy(_BASE)
    trace = data["device_traces"][0]
    trace[where % len(trace)][key] = value
    try:
        snapshot_estimate(check_layout(data, "s.pickle"), name="s")
    except UserError as e:
        assert "\n" not in str(e)
