"""The builder's document: editing, shape inference, JSON files, to_module() and the templates."""

import json
import os

import pytest
import torch

from engine.core.errors import UserError
from engine.sketch.document import Edge, Sketch, list_templates, load_template


def chain(*specs, name="test"):
    sk = Sketch(name)
    prev = None
    for spec in specs:
        t, f = (spec, None) if isinstance(spec, str) else spec
        n = sk.add_node(t, f)
        if prev is not None:
            sk.connect(prev, n.id)
        prev = n.id
    return sk


def test_add_node_fills_defaults_and_names_ids():
    sk = Sketch()
    a = sk.add_node("Conv2d", {"out_channels": 8}, x=10, y=20)
    b = sk.add_node("Conv2d")
    assert (a.id, b.id) == ("conv2d_1", "conv2d_2")
    assert a.fields["out_channels"] == 8 and a.fields["kernel_size"] == (3,) and (a.x, a.y) == (10.0, 20.0)
    sk.remove_node("conv2d_1")
    assert sk.add_node("Conv2d").id == "conv2d_1"
    with pytest.raises(UserError, match="already exists"):
        sk.add_node("ReLU", id="conv2d_2")
    for bad in ("1abc", "a.b", "forward", "class", ""):
        with pytest.raises(UserError, match="Python-style name"):
            sk.add_node("ReLU", id=bad)
    with pytest.raises(UserError, match="did you mean 'Linear'"):
        sk.add_node("Linaer")


def test_connect_refuses_cycles_overfull_inputs_and_outputs():
    sk = chain(("Input", {"shape": (4,)}), ("Linear", {"out_features": 4}), "ReLU")
    with pytest.raises(UserError, match="cycle"):
        sk.connect("relu_1", "linear_1")
    with pytest.raises(UserError, match="takes 1 input"):
        sk.connect("input_1", "relu_1")
    add = sk.add_node("Add", id="loop")
    with pytest.raises(UserError, match="cycle"):
        sk.connect("loop", "loop")
    sk.remove_node("loop")
    with pytest.raises(UserError, match="takes no inputs"):
        sk.connect(sk.add_node("ReLU").id, "input_1")
    out = sk.add_node("Output")
    sk.connect("relu_1", out.id)
    sk.remove_node("relu_2")
    with pytest.raises(UserError, match="nothing can follow"):
        sk.connect(out.id, sk.add_node("ReLU").id)
    add = sk.add_node("Add")
    e0 = sk.connect("linear_1", add.id)
    e1 = sk.connect("relu_1", add.id)
    assert (e0.port, e1.port) == (0, 1)
    with pytest.raises(UserError, match="already connected"):
        sk.connect("input_1", add.id, port=1)
    sk.disconnect(e0)
    assert sk.connect("input_1", add.id).port == 0  # the free port is reused
    with pytest.raises(UserError, match="no connection"):
        sk.disconnect(e0)


def test_insert_on_edge_remove_and_copy():
    sk = chain(("Input", {"shape": (4,)}), ("Linear", {"out_features": 3}), "Output")
    e = sk.edges[1]
    n = sk.insert_on_edge(e, "ReLU")
    assert [(x.src, x.dst) for x in sk.edges] == [("input_1", "linear_1"), ("linear_1", "relu_1"),
                                                   ("relu_1", "output_1")]
    assert sk.topo_order() == ["input_1", "linear_1", "relu_1", "output_1"]
    assert n.y == (sk.nodes["linear_1"].y + sk.nodes["output_1"].y) / 2
    for bad in ("Input", "Output"):
        with pytest.raises(UserError, match="cannot be inserted"):
            sk.insert_on_edge(sk.edges[0], bad)
    other = sk.copy()
    removed = sk.remove_node("relu_1")
    assert len(removed) == 2 and len(sk.edges) == 1
    assert "relu_1" in other.nodes and len(other.edges) == 3
    other.set_field("linear_1", "out_features", 9)
    assert sk.nodes["linear_1"].fields["out_features"] == 3
    sk.move_node("linear_1", 5, 6)
    assert (sk.nodes["linear_1"].x, sk.nodes["linear_1"].y) == (5.0, 6.0)


def test_set_field_validates_and_names_node_and_field():
    sk = chain(("Input", {"shape": (3, 8, 8)}), ("Conv2d", {"out_channels": 4}))
    assert sk.set_field("conv2d_1", "kernel_size", "5") == (5,)
    with pytest.raises(UserError) as e:
        sk.set_field("conv2d_1", "kernel_size", 0)
    assert str(e.value) == "node 'conv2d_1' field 'kernel_size': must be ≥ 1"
    assert sk.nodes["conv2d_1"].fields["kernel_size"] == (5,)  # refused values leave the node alone
    with pytest.raises(UserError, match="no node 'nope'"):
        sk.set_field("nope", "kernel_size", 3)


def test_shape_errors_mark_the_node_and_its_dependents_only():
    sk = Sketch()
    sk.add_node("Input", {"shape": (3, 16, 16)}, id="img")
    sk.add_node("Conv2d", {"in_channels": 4, "out_channels": 8}, id="bad")
    sk.add_node("ReLU", id="after_bad")
    sk.add_node("Flatten", id="flat")
    sk.add_node("Conv2d", {"out_channels": 8, "kernel_size": 3, "padding": 1}, id="good")
    sk.add_node("Add", id="merge")
    sk.add_node("Linear", id="orphan")
    for a, b in [("img", "bad"), ("bad", "after_bad"), ("after_bad", "flat"), ("img", "good"), ("good", "merge"),
                 ("after_bad", "merge")]:
        sk.connect(a, b)
    res = sk.infer_shapes()
    assert res["img"].shape == (3, 16, 16)
    assert res["bad"].error == "expects 4 input channels, got 3" and res["bad"].shape is None
    assert res["after_bad"].error == "depends on bad"
    assert res["flat"].error == "depends on bad"
    assert res["merge"].error == "depends on bad"
    assert res["good"].shape == (8, 16, 16) and res["good"].params == 8 * 3 * 9 + 8
    assert res["orphan"].error == "Linear needs an input, has 0"
    with pytest.raises(UserError) as e:
        sk.to_module()
    assert str(e.value) == "node 'bad' (Conv2d): expects 4 input channels, got 3"


def test_token_ids_must_go_through_an_embedding():
    sk = chain(("Input", {"shape": (12,), "dtype": "int64"}), ("Linear", {"out_features": 4}))
    assert "token ids (int64) go into an Embedding first" in sk.infer_shapes()["linear_1"].error
    sk = chain(("Input", {"shape": (12,), "dtype": "int64"}), ("Embedding", {"num_embeddings": 50,
                                                                               "embedding_dim": 8}),
               ("LSTM", {"hidden_size": 6}), "Output")
    assert sk.infer_shapes()["output_1"].shape == (12, 6)
    x = sk.example_inputs(3)
    assert x.dtype == torch.int64 and x.shape == (3, 12) and int(x.max()) < 50
    assert sk.to_module()(x).shape == (3, 12, 6)
    sk2 = chain(("Input", {"shape": (4,)}), ("Embedding", {"num_embeddings": 5}))
    assert "needs int64 token ids" in sk2.infer_shapes()["embedding_1"].error


def test_json_round_trip_and_validation_names_the_place(tmp_path):
    sk = load_template("resnet18")
    d = sk.to_json()
    assert d["format"] == "vramscope-sketch" and d["version"] == 1
    again = Sketch.from_json(json.loads(json.dumps(d)))
    assert again.to_json() == d and again.parameter_count() == sk.parameter_count()

    bad = json.loads(json.dumps(d))
    bad["nodes"][1]["fields"]["kernel_size"] = 0
    with pytest.raises(UserError) as e:
        Sketch.from_json(bad)
    assert str(e.value) == "node 'conv1' field 'kernel_size': must be ≥ 1"
    for mutate, msg in [
        (lambda b: b.update(format="something"), 'not a VRAMScope sketch ("format" should be "vramscope-sketch")'),
        (lambda b: b.update(version=99), "sketch version 99 was written by a newer VRAMScope"),
        (lambda b: b.update(nodes={}), 'sketch "nodes" must be a list'),
        (lambda b: b["nodes"][2].update(type="BatchNorm"), "node 'bn1': unknown layer type 'BatchNorm'"),
        (lambda b: b["nodes"][1]["fields"].update(kernel=3), "node 'conv1' field 'kernel': Conv2d has no field"),
        (lambda b: b["edges"].append({"src": "fc", "dst": "conv1"}), "would make a cycle"),
        (lambda b: b["edges"].append({"src": "fc", "dst": "ghost"}), "no node 'ghost'"),
        (lambda b: b["nodes"].append({"id": "x"}), 'needs a string "id" and "type"'),
    ]:
        b = json.loads(json.dumps(d))
        mutate(b)
        with pytest.raises(UserError) as e:
            Sketch.from_json(b)
        assert msg in str(e.value) and "\n" not in str(e.value), (str(e.value), msg)
    with pytest.raises(UserError, match="expected a JSON object"):
        Sketch.from_json([1, 2])


def test_load_and_atomic_save(tmp_path):
    sk = load_template("mlp")
    p = tmp_path / "m.json"
    sk.save(p)
    assert Sketch.load(p).to_json() == sk.to_json()
    assert sorted(os.listdir(tmp_path)) == ["m.json"]  # no temp file left behind
    sk.set_field("fc1", "out_features", 100)
    sk.save(p)
    assert Sketch.load(p).nodes["fc1"].fields["out_features"] == 100
    with pytest.raises(UserError, match="sketch file not found"):
        Sketch.load(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text('{"format": "vramscope-sketch", ')
    with pytest.raises(UserError, match=r"broken.json: not valid JSON \(line 1, column 32"):
        Sketch.load(tmp_path / "broken.json")
    (tmp_path / "garbage.json").write_bytes(b"\x00\xff\xfe garbage")
    with pytest.raises(UserError):
        Sketch.load(tmp_path / "garbage.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(UserError, match="other.json: not a VRAMScope sketch"):
        Sketch.load(tmp_path / "other.json")
    with pytest.raises(UserError, match="cannot write sketch"):
        sk.save(tmp_path / "no" / "such" / "dir.json")
    assert Sketch.load(p).nodes["fc1"].fields["out_features"] == 100


def test_templates_parameter_counts_and_modules():
    names = [n for n, _ in list_templates()]
    for want in ("mlp", "lenet", "resnet18", "small-vit", "small-gpt", "unet"):
        assert want in names
    # torchvision's resnet18 (published: 11,689,512) and the classic LeNet-5 on 28×28 (61,706)
    assert load_template("resnet18").parameter_count() == 11_689_512
    assert load_template("lenet").parameter_count() == 61_706
    # 784-512-256-10 MLP: 784·512+512 + 512·256+256 + 256·10+10
    assert load_template("mlp").parameter_count() == 401_920 + 131_328 + 2_570
    for name in names:
        sk = load_template(name)
        assert not sk.errors(), name
        m = sk.to_module()
        assert sum(p.numel() for p in m.parameters()) == sk.parameter_count()
        # submodules are named by node id, so the tracer's rows map back to canvas nodes
        assert {n for n, _ in m.named_children()} <= set(sk.nodes)
        with torch.device("meta"):
            mm = sk.to_module()
            x = sk.example_inputs(2)
            y = mm(x)
        assert x.device.type == "meta"
        assert tuple(y.shape) == (2, *sk.infer_shapes()[sk.output_ids()[0]].shape)
    with pytest.raises(UserError, match="did you mean 'resnet18'"):
        load_template("resnet-18")


def test_real_forward_and_backward_of_a_branching_sketch():
    sk = Sketch("branches")
    sk.add_node("Input", {"shape": (3, 8, 8)}, id="img")
    sk.add_node("Conv2d", {"out_channels": 4, "padding": 1}, id="a")
    sk.add_node("Conv2d", {"out_channels": 2, "kernel_size": 1}, id="b")
    sk.add_node("Concat", id="cat")
    sk.add_node("Flatten", id="flat")
    sk.add_node("Linear", {"out_features": 5}, id="head")
    sk.add_node("Output", id="out")
    for a, b in [("img", "a"), ("img", "b"), ("a", "cat"), ("b", "cat"), ("cat", "flat"), ("flat", "head"),
                 ("head", "out")]:
        sk.connect(a, b)
    assert sk.infer_shapes()["cat"].shape == (6, 8, 8)
    m = sk.to_module()
    y = m(sk.example_inputs(4))
    assert y.shape == (4, 5)
    y.sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    with pytest.raises(UserError, match="batch size must be a positive whole number"):
        sk.example_inputs(0)
    assert Edge("a", "cat", 0) in sk.edges
