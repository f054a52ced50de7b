"""The layer catalogue: shapes, parameter counts and generated constructors checked against real torch modules."""

import re
from typing import get_args

import pytest
import torch
from torch import nn

from engine.core.errors import UserError
from engine.sketch import catalogue as cat
from engine.sketch.catalogue import CATALOGUE, groups, validate_field
from engine.sketch.layer_types import ShapeError

REQUIRED = """Input Output Linear Conv1d Conv2d Conv3d ConvTranspose2d BatchNorm1d BatchNorm2d LayerNorm GroupNorm
RMSNorm ReLU GELU SiLU Tanh Sigmoid LeakyReLU Softmax Dropout MaxPool2d AvgPool2d AdaptiveAvgPool2d AdaptiveMaxPool2d
Flatten Reshape Embedding LSTM GRU MultiheadAttention TransformerEncoderLayer TransformerDecoderLayer Add
Concat""".split()

# (type, fields, input shapes without batch) — at least one per layer type, several for the tricky ones
CASES = [
    ("Linear", {"out_features": 7}, [(5,)]),
    ("Linear", {"out_features": 7, "bias": False}, [(3, 5)]),
    ("Conv1d", {"out_channels": 4, "kernel_size": 3, "stride": 2}, [(3, 17)]),
    ("Conv2d", {"out_channels": 8, "kernel_size": (3, 5), "padding": (1, 2), "groups": 2}, [(4, 9, 11)]),
    ("Conv2d", {"out_channels": 6, "kernel_size": 3, "dilation": 2, "bias": False}, [(3, 12, 12)]),
    ("Conv3d", {"out_channels": 2, "kernel_size": 3, "padding": 1}, [(3, 4, 6, 6)]),
    ("ConvTranspose2d", {"out_channels": 4, "kernel_size": 3, "stride": 2, "output_padding": 1}, [(6, 5, 5)]),
    ("BatchNorm1d", {}, [(6,)]),
    ("BatchNorm1d", {}, [(6, 9)]),
    ("BatchNorm2d", {"affine": False}, [(6, 4, 4)]),
    ("LayerNorm", {}, [(3, 10)]),
    ("LayerNorm", {"bias": False}, [(10,)]),
    ("GroupNorm", {"num_groups": 2}, [(6, 4, 4)]),
    ("RMSNorm", {}, [(3, 10)]),
    ("ReLU", {}, [(3, 4)]), ("GELU", {"approximate": "tanh"}, [(3, 4)]), ("SiLU", {}, [(3, 4)]),
    ("Tanh", {}, [(3, 4)]), ("Sigmoid", {}, [(3, 4)]), ("LeakyReLU", {"negative_slope": 0.2}, [(3, 4)]),
    ("Softmax", {"dim": 1}, [(3, 4)]), ("Dropout", {"p": 0.5}, [(3, 4)]),
    ("MaxPool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, [(2, 9, 9)]),
    ("AvgPool2d", {"kernel_size": 2}, [(2, 9, 8)]),
    ("AdaptiveAvgPool2d", {"output_size": (2, 3)}, [(2, 9, 8)]),
    ("AdaptiveMaxPool2d", {"output_size": 1}, [(2, 9, 8)]),
    ("Mean", {"dim": 1}, [(5, 4)]),
    ("Flatten", {}, [(2, 3, 4)]),
    ("Flatten", {"start_dim": 2}, [(2, 3, 4)]),
    ("Reshape", {"shape": (4, -1)}, [(2, 3, 4)]),
    ("Permute", {"dims": (0, 2, 1)}, [(3, 5)]),
    ("LSTM", {"hidden_size": 6, "num_layers": 2, "bidirectional": True}, [(5, 4)]),
    ("GRU", {"hidden_size": 6}, [(5, 4)]),
    ("MultiheadAttention", {"num_heads": 2}, [(5, 8)]),
    ("MultiheadAttention", {"num_heads": 2, "bias": False}, [(5, 8)]),
    ("PositionalEmbedding", {"max_len": 9}, [(5, 8)]),
    ("TransformerEncoderLayer", {"nhead": 2, "dim_feedforward": 16}, [(5, 8)]),
    ("TransformerDecoderLayer", {"nhead": 2, "dim_feedforward": 16, "norm_first": True}, [(5, 8)]),
    ("Add", {}, [(3, 4), (3, 4), (3, 4)]),
    ("Concat", {"dim": 1}, [(3, 4), (5, 4)]),
    ("Concat", {"dim": -1}, [(3, 4), (3, 2)]),
]


def _add_up(formula):
    """The number a parameter formula shows, e.g. "64·3·7·7 + 64" or "4·8² + 4·8 (in/out projections)"."""
    expr = re.sub(r"\([^)]*\)", "", formula)  # words in brackets
    expr = re.sub(r"\b\d+ [A-Za-z]+", "", expr)  # a count of parts ("2 LayerNorms"), their sum follows
    expr = re.sub(r"[A-Za-z]+", "", expr).replace("·", "*").replace("²", "**2")
    assert re.fullmatch(r"[0-9*+ ]+", expr), formula
    return eval(expr, {"__builtins__": {}})  # digits, * and + only (checked above)


def _call(lt, m, xs):
    if lt.call == "first":
        return m(xs[0])[0]
    if lt.call == "self_attn":
        return m(xs[0], xs[0], xs[0], need_weights=False)[0]
    return m(*xs)


def test_catalogue_has_every_required_type_in_a_group():
    for name in REQUIRED:
        assert name in CATALOGUE, name
    listed = [n for names in groups().values() for n in names]
    assert sorted(listed) == sorted(CATALOGUE)
    assert list(groups())[0] == "Input/Output"
    for lt in CATALOGUE.values():
        assert lt.description and lt.group in cat.GROUP_ORDER
        for f in lt.fields:
            # every default passes its own validation unchanged
            assert validate_field(lt.type_name, f.name, f.default) == f.default


def test_every_case_covers_the_catalogue():
    covered = {c[0] for c in CASES} | {"Input", "Output", "Embedding"}
    assert covered == set(CATALOGUE)


@pytest.mark.parametrize("type_name,fields,in_shapes", CASES)
def test_shape_params_buffers_and_code_match_real_modules(type_name, fields, in_shapes):
    lt = CATALOGUE[type_name]
    fields = {k: validate_field(type_name, k, v) for k, v in fields.items()}
    m = lt.build(fields, in_shapes)
    m.train()
    xs = [torch.randn(2, *s) for s in in_shapes]
    y = _call(lt, m, xs)
    # measured against the module itself
    assert lt.infer_shape(fields, in_shapes) == tuple(y.shape[1:])
    assert lt.param_count(fields, in_shapes) == sum(p.numel() for p in m.parameters())
    assert lt.buffer_count(fields, in_shapes) == sum(b.numel() for b in m.buffers())
    # the formula shown beside the count (where the layer has one) adds up to it
    formula = lt.param_formula(fields, in_shapes)
    if formula:
        assert _add_up(formula) == sum(p.numel() for p in m.parameters()), formula
    # the generated constructor builds the same parameter shapes
    ns = {"nn": nn, "torch": torch, **{k: getattr(cat, k) for k in
                                        ("Reshape", "Permute", "Mean", "PositionalEmbedding", "Add", "Concat",
                                         "CausalTransformerBlock")}}
    other = eval(lt.code(fields, in_shapes), ns)  # our own generated source, not user input
    assert [p.shape for p in other.parameters()] == [p.shape for p in m.parameters()]
    assert type(other).__name__ == type(m).__name__


def test_embedding_and_io_nodes():
    emb = CATALOGUE["Embedding"]
    f = {"num_embeddings": 100, "embedding_dim": 16}
    m = emb.build(f, [(7,)])
    assert emb.infer_shape(f, [(7,)]) == tuple(m(torch.randint(0, 100, (2, 7))).shape[1:])
    assert emb.param_count(f, [(7,)]) == 1600
    assert CATALOGUE["Input"].infer_shape({"shape": (3, 8, 8)}, []) == (3, 8, 8)
    assert CATALOGUE["Output"].infer_shape({}, [(10,)]) == (10,)


def test_published_figures():
    # the seeds' worked examples (their parameter counts are right; their activation figure is not)
    lin = CATALOGUE["Linear"]
    conv = CATALOGUE["Conv2d"]
    assert lin.param_count({"out_features": 256}, [(512,)]) == 131_328
    assert conv.param_count({"out_channels": 64, "kernel_size": 3}, [(3, 32, 32)]) == 1_792
    assert conv.param_count({"out_channels": 128, "kernel_size": 3}, [(64, 32, 32)]) == 73_856
    f = {"out_channels": 64, "kernel_size": 7, "stride": 2, "padding": 3}
    assert conv.infer_shape(f, [(3, 224, 224)]) == (64, 112, 112)
    assert conv.code({**f, "kernel_size": (7,), "stride": (2,), "padding": (3,)}, [(3, 224, 224)]) == \
        "nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3)"


@pytest.mark.parametrize("type_name,fields,in_shapes,reason", [
    ("Conv2d", {"in_channels": 64}, [(32, 8, 8)], "expects 64 input channels, got 32"),
    ("Conv2d", {"kernel_size": (9,)}, [(3, 4, 4)], "kernel 9 is larger than the padded input 4"),
    ("Conv2d", {}, [(3, 4)], "Conv2d expects channels × H × W per sample (3 dims), got (3, 4)"),
    ("Linear", {"in_features": 10}, [(12,)], "expects 10 input features, got 12"),
    ("Add", {}, [(3, 4), (4, 3)], "Add needs equal shapes, got (3, 4) and (4, 3)"),
    ("Add", {}, [(3, 4)], "Add needs at least 2 inputs, has 1"),
    ("Concat", {"dim": 1}, [(3, 4), (3, 5)], "Concat along dim 1 needs the other dimensions equal"),
    ("Reshape", {"shape": (5, -1)}, [(2, 3)], "cannot reshape (2, 3) (6 elements) to (5, -1)"),
    ("GroupNorm", {"num_groups": 4}, [(6, 2, 2)], "num_groups 4 does not divide 6 channels"),
    ("MultiheadAttention", {"num_heads": 3}, [(5, 8)], "num_heads 3 does not divide the 8 features"),
    ("Flatten", {"start_dim": 0}, [(3, 4)], "start_dim 0 is the batch dimension"),
    ("MaxPool2d", {"kernel_size": 2, "padding": 2}, [(1, 8, 8)], "padding 2 must be at most half the kernel"),
    ("Linear", {}, [], "Linear needs an input, has 0"),
])
def test_shape_errors_give_the_human_reason(type_name, fields, in_shapes, reason):
    fields = {k: validate_field(type_name, k, v) for k, v in fields.items()}
    with pytest.raises(ShapeError) as e:
        CATALOGUE[type_name].infer_shape(fields, in_shapes)
    assert reason in str(e.value)
    assert "\n" not in str(e.value)


def test_validate_field_coerces_and_refuses_with_the_reason():
    assert validate_field("Conv2d", "kernel_size", "3, 5") == (3, 5)
    assert validate_field("Conv2d", "kernel_size", "3x3") == (3, 3)
    assert validate_field("Conv2d", "kernel_size", 7) == (7,)
    assert validate_field("Linear", "out_features", "64") == 64
    assert validate_field("Linear", "out_features", 64.0) == 64
    assert validate_field("Linear", "bias", "false") is False
    assert validate_field("Dropout", "p", "0.25") == 0.25
    assert validate_field("Input", "dtype", "int64") == "int64"
    for type_name, field, value, msg in [
        ("Conv2d", "kernel_size", 0, "kernel_size must be ≥ 1"),
        ("Conv2d", "kernel_size", "a,b", "kernel_size must be a whole number"),
        ("Linear", "out_features", 2.5, "out_features must be a whole number"),
        ("Linear", "out_features", True, "out_features must be a whole number"),
        ("Dropout", "p", 1.5, "p must be ≤ 1"),
        ("Dropout", "p", "nan", "p must be a finite number"),
        ("GELU", "approximate", "fast", "approximate must be one of none, tanh"),
        ("Linear", "bias", "maybe", "bias must be true or false"),
    ]:
        with pytest.raises(UserError) as e:
            validate_field(type_name, field, value)
        assert str(e.value).startswith(msg), (str(e.value), msg)
    with pytest.raises(UserError, match="unknown layer type 'Conv2D' \\(did you mean 'Conv2d'\\?\\)"):
        validate_field("Conv2D", "kernel_size", 3)
    with pytest.raises(UserError, match="Linear has no field 'units'"):
        validate_field("Linear", "units", 3)


def test_every_layer_type_names_an_analytic_rule_and_every_rule_is_used():
    """What autograd keeps of a layer is its catalogue entry's `keeps` kind; engine.sketch.keep_rules.LAYER_RULES has
    one function per kind. A kind without its function, or a function no layer names, fails here."""
    from engine.sketch.keep_rules import LAYER_RULES
    from engine.sketch.layer_types import KeepRule

    kinds = set(get_args(KeepRule))
    assert set(LAYER_RULES) == kinds
    assert {lt.keeps for lt in CATALOGUE.values()} == kinds


def test_a_layer_type_cannot_be_declared_without_its_rule():
    """`keeps` has no default: a new entry that does not say what autograd keeps of it is refused at import."""
    with pytest.raises(TypeError, match="keeps"):
        cat.LayerType("Identity", "Activation", (), 1, 1, "x.", lambda f, s: s[0], lambda f, s: 0, None,
                      lambda f, s: nn.Identity(), lambda f, s: "nn.Identity()")
