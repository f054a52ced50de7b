"""Issue 12: sketch files a user (or an attacker) can hand the loader: deep nesting, huge numbers, NaN and
Infinity, edges in any order at 10,000 nodes; every one is a sketch or one line naming the place."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from benchmarks.sketch_load import chain
from engine.core.errors import UserError
from engine.sketch.document import Sketch, parse_json

BASE = chain(6, reverse=False)


def load_text(tmp_path, text: str) -> str:
    p = tmp_path / "s.json"
    p.write_text(text)
    with pytest.raises(UserError) as e:
        Sketch.load(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg
    return msg


def test_deep_nesting_is_one_line(tmp_path):
    assert "nested too deeply" in load_text(tmp_path, "[" * 100_000 + "]" * 100_000)


def test_a_version_of_5001_digits_is_one_line(tmp_path):
    d = dict(BASE)
    text = json.dumps(d).replace('"version": 1', '"version": ' + "9" * 5001)
    assert "number too long" in load_text(tmp_path, text)


@pytest.mark.parametrize("coord", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_coordinates_are_refused(tmp_path, coord):
    text = json.dumps(BASE).replace('"type": "Input"', f'"type": "Input", "x": {coord}', 1)
    msg = load_text(tmp_path, text)
    assert ("finite" in msg) and ("node 'x'" in msg or coord in msg)


@pytest.mark.parametrize("value", [10**18, 10**300, int("9" * 4001)])
def test_huge_layer_fields_are_refused(value):
    d = json.loads(json.dumps(BASE))
    d["nodes"].insert(1, {"id": "fc", "type": "Linear", "fields": {"out_features": value}})
    with pytest.raises(UserError, match=r"node 'fc' field 'out_features': is too large"):
        Sketch.from_json(d)


@pytest.mark.parametrize("reverse", [False, True])
def test_ten_thousand_nodes_load_in_any_edge_order(tmp_path, reverse):
    p = tmp_path / "big.json"
    p.write_text(json.dumps(chain(10_000, reverse)))
    sk = Sketch.load(p)
    assert len(sk.nodes) == 10_000 and len(sk.edges) == 9_999
    assert sk.topo_order()[0] == "x" and sk.topo_order()[-1] == "out"
    assert sk.infer_shapes()["out"].shape == (8,)


def test_a_cycle_in_a_file_names_the_edge_that_closes_it():
    d = json.loads(json.dumps(BASE))
    d["nodes"].insert(1, {"id": "add", "type": "Add", "fields": {}})
    d["edges"] = [{"src": "x", "dst": "add"}, {"src": "add", "dst": "r0"}, {"src": "r0", "dst": "r1"},
                  {"src": "r1", "dst": "add"}, {"src": "r1", "dst": "out"}]
    with pytest.raises(UserError, match=r"edge #4 \('r1' → 'add'\): connecting 'r1' → 'add' would make a cycle"):
        Sketch.from_json(d)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
node = st.fixed_dictionaries(
    {"id": st.sampled_from(["x", "a", "b", "out", "def", "1x"]) | st.text(max_size=5),
     "type": st.sampled_from(["Input", "Linear", "ReLU", "Add", "Output", "Conv2d", "Nope"]),
     "fields": st.dictionaries(st.sampled_from(["shape", "out_features", "in_features", "bias", "kernel_size"]),
                               json_values, max_size=3)},
    optional={"x": json_values, "y": json_values})
ends = st.sampled_from(["x", "a", "b", "out"])
edge = st.fixed_dictionaries({"src": ends, "dst": ends}, optional={"port": json_values})
sketch_dicts = st.fixed_dictionaries(
    {"format": st.just("vramscope-sketch") | json_values, "version": st.just(1) | json_values,
     "nodes": st.lists(node, max_size=6) | json_values, "edges": st.lists(edge, max_size=8) | json_values},
    optional={"name": json_values})


@settings(max_examples=300, deadline=None)
@given(sketch_dicts)
def test_any_sketch_dict_loads_or_is_one_line(d):
    try:
        sk = Sketch.from_json(d)
    except UserError as e:
        assert "\n" not in str(e) and str(e)
        return
    sk.infer_shapes()  # a loaded sketch can be analysed: no exception escapes
    assert Sketch.from_json(json.loads(sk.to_json_text())).to_json() == sk.to_json()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=60) | json_values.map(json.dumps))
def test_any_text_parses_or_is_one_line(text):
    try:
        parse_json(text, "f.json")
    except UserError as e:
        assert "\n" not in str(e) and str(e).startswith("f.json: ")
