"""The builder's layer catalogue: every layer type's fields, shape inference, parameter count (and how it adds
up), what autograd keeps of it in training (the rule the analytic estimate applies), module and source.

One table (CATALOGUE) feeds the palette, the inspector, validation, the analytic estimate and code export. What a
layer type is, and a field's coercion, are engine.sketch.layer_types'; the modules torch lacks
engine.sketch.layer_modules'. Shapes here never include the batch dimension; `dim` fields use PyTorch's own numbering
(batch = dim 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch import nn

from ..core.errors import UserError
from .layer_modules import Add, CausalTransformerBlock, Concat, Mean, Permute, PositionalEmbedding, Reshape
from .layer_types import (
    BuildFn,
    CodeFn,
    Fields,
    FieldSpec,
    FieldValue,
    KeepRule,
    LayerType,
    Shape,
    ShapeError,
    Shapes,
    coerce_field,
    conv_out_len,
    conv_transpose_out_len,
    fmt_shape,
)

# ---------------------------------------------------------------- small shape helpers

def _torch_layer(name: str) -> type[nn.Module]:
    """torch.nn's module class of that name (the catalogue's type names are torch's own)."""
    cls: type[nn.Module] = getattr(nn, name)
    return cls


def _ntuple(value: int | tuple[int, ...] | list[int], n: int, name: str) -> tuple[int, ...]:
    v = tuple(value) if isinstance(value, (tuple, list)) else (int(value),)
    if len(v) == 1:
        return v * n
    if len(v) != n:
        raise ShapeError(f"{name} needs 1 or {n} values, got {len(v)}")
    return v


def _code_tuple(v: tuple[int, ...]) -> str:
    return str(v[0]) if len(set(v)) == 1 else "(" + ", ".join(map(str, v)) + ")"


def _rank(s: Shape, n: int, what: str, type_name: str) -> None:
    if len(s) != n:
        raise ShapeError(f"{type_name} expects {what} per sample ({n} dims), got {fmt_shape(s)}")


def _channels(f: Fields, key: str, got: int, what: str = "input channels") -> int:
    want = int(f.get(key) or 0)
    if want and want != got:
        raise ShapeError(f"expects {want} {what}, got {got}")
    return got


def _norm_dim(dim: int, full_rank: int, what: str) -> int:
    """A PyTorch dim index (batch = 0) → index into the batchless shape; refuses the batch dim."""
    d = dim + full_rank if dim < 0 else dim
    if not 0 <= d < full_rank:
        raise ShapeError(f"{what} {dim} is out of range for a {full_rank - 1}-dim sample (plus batch)")
    if d == 0:
        raise ShapeError(f"{what} {dim} is the batch dimension")
    return d - 1


# ---------------------------------------------------------------- field shorthands

def _int(name: str, default: int, lo: int | None = None, hi: int | None = None, help: str = "") -> FieldSpec:
    return FieldSpec(name, "int", default, lo, hi, (), help)


def _float(name: str, default: float, lo: float | None = None, hi: float | None = None, help: str = "") -> FieldSpec:
    return FieldSpec(name, "float", default, lo, hi, (), help)


def _bool(name: str, default: bool, help: str = "") -> FieldSpec:
    return FieldSpec(name, "bool", default, help=help)


def _choice(name: str, default: str, choices: Sequence[str], help: str = "") -> FieldSpec:
    return FieldSpec(name, "choice", default, choices=tuple(choices), help=help)


def _ints(name: str, default: Sequence[int], lo: int | None = None, hi: int | None = None, help: str = "") -> FieldSpec:
    return FieldSpec(name, "ints", tuple(default), lo, hi, (), help)


_AUTO = "0 = take it from the input"

CATALOGUE: dict[str, LayerType] = {}


def _register(lt: LayerType) -> None:
    CATALOGUE[lt.type_name] = lt


def _none_params(f: Fields, s: Shapes) -> int:
    return 0


# ---------------------------------------------------------------- Input / Output

def _input_infer(f: Fields, s: Shapes) -> Shape:
    shape = tuple(f["shape"])
    if not shape:
        raise ShapeError("input shape is empty; give the shape of one sample, e.g. 3, 224, 224")
    return shape


_register(LayerType(
    "Input", "Input/Output",
    (_ints("shape", (3, 32, 32), 1, help="shape of one sample, without the batch dimension"),
     _choice("dtype", "float32", ("float32", "int64"), help="int64 for token ids (feed an Embedding)")),
    0, 0, "The model's input: one sample's shape (the batch size is set in the training configuration).",
    _input_infer, _none_params, None, None, lambda f, s: "",
    keeps="source", input_dtype="any", call="none", alias=True))

_register(LayerType(
    "Output", "Input/Output", (), 1, 1, "Marks the model's output (the loss is its sum).",
    lambda f, s: s[0], _none_params, None, None, lambda f, s: "",
    keeps="nothing", input_dtype="any", call="none", alias=True))


# ---------------------------------------------------------------- Linear

def _linear_infer(f: Fields, s: Shapes) -> Shape:
    x = s[0]
    if len(x) < 1:
        raise ShapeError("Linear needs at least one feature dimension")
    _channels(f, "in_features", x[-1], "input features")
    return x[:-1] + (f["out_features"],)


def _linear_params(f: Fields, s: Shapes) -> int:
    return int(s[0][-1] * f["out_features"] + (f["out_features"] if f["bias"] else 0))


_register(LayerType(
    "Linear", "Linear",
    (_int("in_features", 0, 0, help=_AUTO), _int("out_features", 128, 1), _bool("bias", True)),
    1, 1, "y = x·Wᵀ + b over the last dimension.",
    _linear_infer, _linear_params, None,
    lambda f, s: nn.Linear(s[0][-1], f["out_features"], bias=f["bias"]),
    lambda f, s: f"nn.Linear({s[0][-1]}, {f['out_features']}" + ("" if f["bias"] else ", bias=False") + ")",
    keeps="linear",
    _formula=lambda f, s: f"{s[0][-1]}·{f['out_features']}" + (f" + {f['out_features']}" if f["bias"] else "")))


# ---------------------------------------------------------------- Convolutions

def _conv_fields(transpose: bool = False) -> tuple[FieldSpec, ...]:
    fs = [_int("in_channels", 0, 0, help=_AUTO), _int("out_channels", 64, 1),
          _ints("kernel_size", (3,), 1), _ints("stride", (1,), 1), _ints("padding", (0,), 0)]
    if transpose:
        fs.append(_ints("output_padding", (0,), 0))
    fs += [_ints("dilation", (1,), 1), _int("groups", 1, 1), _bool("bias", True)]
    return tuple(fs)


def _conv_make(nd: int, transpose: bool) -> LayerType:
    name = f"ConvTranspose{nd}d" if transpose else f"Conv{nd}d"

    def geom(f: Fields) -> dict[str, tuple[int, ...]]:
        g = {k: _ntuple(f[k], nd, k) for k in ("kernel_size", "stride", "padding", "dilation")}
        if transpose:
            g["output_padding"] = _ntuple(f["output_padding"], nd, "output_padding")
        return g

    def infer(f: Fields, s: Shapes) -> Shape:
        x = s[0]
        _rank(x, nd + 1, "channels × " + " × ".join("DHW"[3 - nd:]), name)
        cin = _channels(f, "in_channels", x[0])
        groups, cout = f["groups"], f["out_channels"]
        if cin % groups or cout % groups:
            raise ShapeError(f"groups={groups} must divide both in ({cin}) and out ({cout}) channels")
        g = geom(f)
        out = []
        for i, n in enumerate(x[1:]):
            k, st, p, d = g["kernel_size"][i], g["stride"][i], g["padding"][i], g["dilation"][i]
            if transpose:
                op = g["output_padding"][i]
                if op >= max(st, d):
                    raise ShapeError(f"output_padding {op} must be smaller than stride or dilation")
                o = conv_transpose_out_len(n, k, st, p, d, op)
            else:
                o = conv_out_len(n, k, st, p, d)
            if o <= 0:
                raise ShapeError(f"kernel {d * (k - 1) + 1} is larger than the padded input {n + 2 * p}")
            out.append(o)
        return (cout, *out)

    def params(f: Fields, s: Shapes) -> int:
        cin, cout, groups = s[0][0], f["out_channels"], f["groups"]
        k = math.prod(geom(f)["kernel_size"])
        w = (cin * (cout // groups) if transpose else cout * (cin // groups)) * k
        return int(w + (cout if f["bias"] else 0))

    cls = _torch_layer(name)

    def build(f: Fields, s: Shapes) -> nn.Module:
        g = geom(f)
        kw: dict[str, Any] = dict(stride=g["stride"], padding=g["padding"], dilation=g["dilation"],
                                  groups=f["groups"], bias=f["bias"])
        if transpose:
            kw["output_padding"] = g["output_padding"]
        return cls(s[0][0], f["out_channels"], g["kernel_size"], **kw)

    def code(f: Fields, s: Shapes) -> str:
        g = geom(f)
        parts = [str(s[0][0]), str(f["out_channels"]), f"kernel_size={_code_tuple(g['kernel_size'])}"]
        for key, dflt in (("stride", 1), ("padding", 0), ("output_padding", 0), ("dilation", 1)):
            if key in g and set(g[key]) != {dflt}:
                parts.append(f"{key}={_code_tuple(g[key])}")
        if f["groups"] != 1:
            parts.append(f"groups={f['groups']}")
        if not f["bias"]:
            parts.append("bias=False")
        return f"nn.{name}({', '.join(parts)})"

    def formula(f: Fields, s: Shapes) -> str:
        c_in, c_out, g = s[0][0], f["out_channels"], f["groups"]
        per = f"{c_in}·{c_out // g}" if transpose else f"{c_out}·{c_in // g}"
        return f"{per}·" + "·".join(map(str, geom(f)["kernel_size"])) + (f" + {c_out}" if f["bias"] else "")

    desc = ("Transposed (up-sampling) convolution" if transpose else f"{nd}-D convolution") + \
        " over channels × " + " × ".join("DHW"[3 - nd:]) + "."
    return LayerType(name, "Convolution", _conv_fields(transpose), 1, 1, desc, infer, params, None, build, code,
                     keeps="conv", _formula=formula)


for _nd in (1, 2, 3):
    _register(_conv_make(_nd, False))
_register(_conv_make(2, True))


# ---------------------------------------------------------------- Normalization

def _affine_formula(f: Fields, s: Shapes) -> str:
    return f"2·{s[0][0]} (weight + bias)" if f["affine"] else ""


def _bn_make(nd: int) -> LayerType:
    name = f"BatchNorm{nd}d"

    def infer(f: Fields, s: Shapes) -> Shape:
        x = s[0]
        ok = (1, 2) if nd == 1 else (3,)
        if len(x) not in ok:
            raise ShapeError(f"{name} expects " + ("(C) or (C, L)" if nd == 1 else "(C, H, W)") +
                             f" per sample, got {fmt_shape(x)}")
        _channels(f, "num_features", x[0], "features")
        return x

    def build(f: Fields, s: Shapes) -> nn.Module:
        return _torch_layer(name)(s[0][0], eps=f["eps"], momentum=f["momentum"], affine=f["affine"])

    def code(f: Fields, s: Shapes) -> str:
        extra = ("" if f["eps"] == 1e-5 else f", eps={f['eps']!r}") + \
            ("" if f["momentum"] == 0.1 else f", momentum={f['momentum']!r}") + \
            ("" if f["affine"] else ", affine=False")
        return f"nn.{name}({s[0][0]}{extra})"

    return LayerType(
        name, "Normalization",
        (_int("num_features", 0, 0, help=_AUTO), _float("eps", 1e-5, 0.0), _float("momentum", 0.1, 0.0, 1.0),
         _bool("affine", True)),
        1, 1, "Batch normalization over the channel dimension (running mean/var kept as buffers).",
        infer, lambda f, s: 2 * s[0][0] if f["affine"] else 0,
        lambda f, s: (2 * s[0][0] + 1, 1), build, code, keeps="batchnorm", _formula=_affine_formula)


_register(_bn_make(1))
_register(_bn_make(2))


def _ln_infer(f: Fields, s: Shapes) -> Shape:
    x = s[0]
    _channels(f, "normalized_shape", x[-1], "features in the last dimension")
    return x


_register(LayerType(
    "LayerNorm", "Normalization",
    (_int("normalized_shape", 0, 0, help="size of the last dimension; " + _AUTO), _float("eps", 1e-5, 0.0),
     _bool("elementwise_affine", True), _bool("bias", True)),
    1, 1, "Layer normalization over the last dimension.",
    _ln_infer, lambda f, s: (s[0][-1] * (1 + (1 if f["bias"] else 0))) if f["elementwise_affine"] else 0, None,
    lambda f, s: nn.LayerNorm(s[0][-1], eps=f["eps"], elementwise_affine=f["elementwise_affine"], bias=f["bias"]),
    lambda f, s: f"nn.LayerNorm({s[0][-1]}" + ("" if f["eps"] == 1e-5 else f", eps={f['eps']!r}") +
    ("" if f["elementwise_affine"] else ", elementwise_affine=False") + ("" if f["bias"] else ", bias=False") + ")",
    keeps="layernorm"))


def _gn_infer(f: Fields, s: Shapes) -> Shape:
    x = s[0]
    if len(x) < 1:
        raise ShapeError("GroupNorm needs a channel dimension")
    c = _channels(f, "num_channels", x[0], "channels")
    if c % f["num_groups"]:
        raise ShapeError(f"num_groups {f['num_groups']} does not divide {c} channels")
    return x


_register(LayerType(
    "GroupNorm", "Normalization",
    (_int("num_groups", 32, 1), _int("num_channels", 0, 0, help=_AUTO), _float("eps", 1e-5, 0.0),
     _bool("affine", True)),
    1, 1, "Group normalization: channels split into groups, normalized per sample.",
    _gn_infer, lambda f, s: 2 * s[0][0] if f["affine"] else 0, None,
    lambda f, s: nn.GroupNorm(f["num_groups"], s[0][0], eps=f["eps"], affine=f["affine"]),
    lambda f, s: f"nn.GroupNorm({f['num_groups']}, {s[0][0]}" + ("" if f["eps"] == 1e-5 else f", eps={f['eps']!r}") +
    ("" if f["affine"] else ", affine=False") + ")",
    keeps="groupnorm", _formula=_affine_formula))


_register(LayerType(
    "RMSNorm", "Normalization",
    (_int("normalized_shape", 0, 0, help="size of the last dimension; " + _AUTO), _float("eps", 1e-6, 0.0),
     _bool("elementwise_affine", True)),
    1, 1, "Root-mean-square normalization over the last dimension (LLaMA style).",
    _ln_infer, lambda f, s: s[0][-1] if f["elementwise_affine"] else 0, None,
    lambda f, s: nn.RMSNorm(s[0][-1], eps=f["eps"], elementwise_affine=f["elementwise_affine"]),
    lambda f, s: f"nn.RMSNorm({s[0][-1]}, eps={f['eps']!r}" +
    ("" if f["elementwise_affine"] else ", elementwise_affine=False") + ")",
    keeps="rmsnorm"))


# ---------------------------------------------------------------- Activations, Dropout

def _same(f: Fields, s: Shapes) -> Shape:
    return s[0]


def _simple(name: str, desc: str, keeps: KeepRule, fields: Sequence[FieldSpec] = (), build: BuildFn | None = None,
            code: CodeFn | None = None) -> None:
    _register(LayerType(
        name, "Activation", tuple(fields), 1, 1, desc, _same, _none_params, None,
        build or (lambda f, s: _torch_layer(name)()), code or (lambda f, s: f"nn.{name}()"), keeps=keeps))


_simple("ReLU", "max(x, 0).", "output")
_simple("GELU", "Gaussian error linear unit.", "input", (_choice("approximate", "none", ("none", "tanh")),),
        lambda f, s: nn.GELU(approximate=f["approximate"]),
        lambda f, s: "nn.GELU()" if f["approximate"] == "none" else f"nn.GELU(approximate={f['approximate']!r})")
_simple("SiLU", "x·sigmoid(x) (swish).", "input")
_simple("Tanh", "Hyperbolic tangent.", "output")
_simple("Sigmoid", "Logistic sigmoid.", "output")
_simple("LeakyReLU", "max(x, 0) + slope·min(x, 0).", "input", (_float("negative_slope", 0.01, 0.0),),
        lambda f, s: nn.LeakyReLU(f["negative_slope"]),
        lambda f, s: "nn.LeakyReLU()" if f["negative_slope"] == 0.01 else f"nn.LeakyReLU({f['negative_slope']!r})")


def _softmax_infer(f: Fields, s: Shapes) -> Shape:
    _norm_dim(f["dim"], len(s[0]) + 1, "dim")
    return s[0]


_register(LayerType(
    "Softmax", "Activation", (_int("dim", -1, help="dimension to normalize (batch = 0)"),), 1, 1,
    "Softmax along one dimension.", _softmax_infer, _none_params, None,
    lambda f, s: nn.Softmax(dim=f["dim"]), lambda f, s: f"nn.Softmax(dim={f['dim']})", keeps="softmax"))

_register(LayerType(
    "Dropout", "Activation", (_float("p", 0.1, 0.0, 1.0, help="probability of zeroing an element"),), 1, 1,
    "Zeroes elements with probability p in training (a mask is kept for backward).",
    _same, _none_params, None, lambda f, s: nn.Dropout(f["p"]),
    lambda f, s: f"nn.Dropout({f['p']!r})", keeps="dropout", input_dtype="float"))


# ---------------------------------------------------------------- Pooling

def _pool_make(name: str, keeps: KeepRule) -> LayerType:
    def geom(f: Fields) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        k = _ntuple(f["kernel_size"], 2, "kernel_size")
        st = _ntuple(f["stride"], 2, "stride")
        st = tuple(kk if ss == 0 else ss for kk, ss in zip(k, st, strict=False))
        p = _ntuple(f["padding"], 2, "padding")
        return k, st, p

    def infer(f: Fields, s: Shapes) -> Shape:
        x = s[0]
        _rank(x, 3, "channels × H × W", name)
        k, st, p = geom(f)
        out = []
        for n, kk, ss, pp in zip(x[1:], k, st, p, strict=False):
            if pp > kk // 2:
                raise ShapeError(f"padding {pp} must be at most half the kernel size {kk}")
            o = conv_out_len(n, kk, ss, pp)
            if o <= 0:
                raise ShapeError(f"kernel {kk} is larger than the padded input {n + 2 * pp}")
            out.append(o)
        return (x[0], *out)

    def build(f: Fields, s: Shapes) -> nn.Module:
        k, st, p = geom(f)
        return _torch_layer(name)(k, stride=st, padding=p)

    def code(f: Fields, s: Shapes) -> str:
        k, st, p = geom(f)
        parts = [_code_tuple(k)]
        if st != k:
            parts.append(f"stride={_code_tuple(st)}")
        if set(p) != {0}:
            parts.append(f"padding={_code_tuple(p)}")
        return f"nn.{name}({', '.join(parts)})"

    return LayerType(
        name, "Pooling",
        (_ints("kernel_size", (2,), 1), _ints("stride", (0,), 0, help="0 = same as kernel_size"),
         _ints("padding", (0,), 0)),
        1, 1, ("Maximum" if name.startswith("Max") else "Average") + " over sliding windows of H × W.",
        infer, _none_params, None, build, code, keeps=keeps)


_register(_pool_make("MaxPool2d", "maxpool"))
_register(_pool_make("AvgPool2d", "input"))


def _adaptive_make(name: str, keeps: KeepRule) -> LayerType:
    def infer(f: Fields, s: Shapes) -> Shape:
        x = s[0]
        _rank(x, 3, "channels × H × W", name)
        return (x[0], *_ntuple(f["output_size"], 2, "output_size"))

    def code(f: Fields, s: Shapes) -> str:
        return f"nn.{name}({_code_tuple(_ntuple(f['output_size'], 2, 'output_size'))})"

    return LayerType(
        name, "Pooling", (_ints("output_size", (1,), 1),), 1, 1,
        ("Maximum" if "Max" in name else "Average") + " pooling to a fixed output size.",
        infer, _none_params, None,
        lambda f, s: _torch_layer(name)(_ntuple(f["output_size"], 2, "output_size")), code, keeps=keeps)


_register(_adaptive_make("AdaptiveAvgPool2d", "adaptive_avg"))
_register(_adaptive_make("AdaptiveMaxPool2d", "maxpool"))


# ---------------------------------------------------------------- Shape

def _flatten_infer(f: Fields, s: Shapes) -> Shape:
    x = s[0]
    r = len(x) + 1
    a = _norm_dim(f["start_dim"], r, "start_dim")
    b = _norm_dim(f["end_dim"], r, "end_dim")
    if a > b:
        raise ShapeError(f"start_dim {f['start_dim']} comes after end_dim {f['end_dim']}")
    return x[:a] + (math.prod(x[a:b + 1]),) + x[b + 1:]


_register(LayerType(
    "Flatten", "Shape",
    (_int("start_dim", 1, help="first dim to flatten (batch = 0)"), _int("end_dim", -1)), 1, 1,
    "Flattens a range of dimensions into one (a view: no new memory).",
    _flatten_infer, _none_params, None, lambda f, s: nn.Flatten(f["start_dim"], f["end_dim"]),
    lambda f, s: "nn.Flatten()" if (f["start_dim"], f["end_dim"]) == (1, -1)
    else f"nn.Flatten({f['start_dim']}, {f['end_dim']})",
    keeps="nothing", input_dtype="any", alias=True))


def _reshape_infer(f: Fields, s: Shapes) -> Shape:
    x = s[0]
    target = tuple(f["shape"])
    n = math.prod(x)
    if any(d == 0 or d < -1 for d in target):
        raise ShapeError("shape entries must be positive, or -1 once")
    if target.count(-1) > 1:
        raise ShapeError("shape may contain -1 only once")
    known = math.prod(d for d in target if d != -1)
    if -1 in target:
        if n % known:
            raise ShapeError(f"cannot reshape {fmt_shape(x)} ({n} elements) to {fmt_shape(target)}")
        target = tuple(n // known if d == -1 else d for d in target)
    elif known != n:
        raise ShapeError(f"cannot reshape {fmt_shape(x)} ({n} elements) to {fmt_shape(target)} ({known})")
    return target


_register(LayerType(
    "Reshape", "Shape", (FieldSpec("shape", "ints", (-1,), -1, None, (), "new shape of one sample; -1 once = infer"),),
    1, 1, "Reshapes each sample (the batch dimension is kept).",
    _reshape_infer, _none_params, None, lambda f, s: Reshape(*_reshape_infer(f, s)),
    lambda f, s: f"Reshape({', '.join(map(str, _reshape_infer(f, s)))})",
    keeps="nothing", input_dtype="any", alias=True))


def _permute_dims(f: Fields, s: Shapes) -> Shape:
    dims = tuple(f["dims"])
    r = len(s[0]) + 1
    norm = tuple(d + r if d < 0 else d for d in dims)
    if sorted(norm) != list(range(r)):
        raise ShapeError(f"dims {fmt_shape(dims)} must list each of the {r} dimensions (batch = 0) once")
    if norm[0] != 0:
        raise ShapeError("dims must keep the batch dimension (0) first")
    return norm


_register(LayerType(
    "Permute", "Shape",
    (FieldSpec("dims", "ints", (0, 2, 1), -8, None, (), "new order of all dims (batch = 0 first)"),),
    1, 1, "Reorders dimensions, e.g. (0, 2, 1) turns channels × positions into positions × channels (a view).",
    lambda f, s: tuple(s[0][d - 1] for d in _permute_dims(f, s)[1:]), _none_params, None,
    lambda f, s: Permute(*_permute_dims(f, s)),
    lambda f, s: f"Permute({', '.join(map(str, _permute_dims(f, s)))})",
    keeps="nothing", input_dtype="any", alias=True))


def _mean_infer(f: Fields, s: Shapes) -> Shape:
    d = _norm_dim(f["dim"], len(s[0]) + 1, "dim")
    out = s[0][:d] + s[0][d + 1:]
    if not out:
        raise ShapeError("averaging away the only dimension leaves nothing per sample")
    return out


_register(LayerType(
    "Mean", "Pooling", (_int("dim", 1, help="dimension to average over (batch = 0)"),), 1, 1,
    "Averages over one dimension (e.g. the sequence before a classifier).",
    _mean_infer, _none_params, None, lambda f, s: Mean(f["dim"]), lambda f, s: f"Mean(dim={f['dim']})",
    keeps="nothing"))


# ---------------------------------------------------------------- Embedding

_register(LayerType(
    "Embedding", "Linear",
    (_int("num_embeddings", 32000, 1, help="vocabulary size"), _int("embedding_dim", 512, 1)),
    1, 1, "Looks up a vector for each token id (its input must be an int64 Input).",
    lambda f, s: s[0] + (f["embedding_dim"],), lambda f, s: f["num_embeddings"] * f["embedding_dim"], None,
    lambda f, s: nn.Embedding(f["num_embeddings"], f["embedding_dim"]),
    lambda f, s: f"nn.Embedding({f['num_embeddings']}, {f['embedding_dim']})", keeps="embedding",
    input_dtype="int64", _formula=lambda f, s: f"{f['num_embeddings']}·{f['embedding_dim']}"))


# ---------------------------------------------------------------- Recurrent

def _rnn_make(name: str, gates: int, keeps: KeepRule) -> LayerType:
    def infer(f: Fields, s: Shapes) -> Shape:
        x = s[0]
        _rank(x, 2, "sequence × features", name)
        _channels(f, "input_size", x[1], "input features")
        return (x[0], f["hidden_size"] * (2 if f["bidirectional"] else 1))

    def params(f: Fields, s: Shapes) -> int:
        h, dirs = f["hidden_size"], 2 if f["bidirectional"] else 1
        total = 0
        for layer in range(f["num_layers"]):
            i = s[0][1] if layer == 0 else h * dirs
            total += dirs * (gates * h * (i + h) + (2 * gates * h if f["bias"] else 0))
        return int(total)

    def build(f: Fields, s: Shapes) -> nn.Module:
        return _torch_layer(name)(s[0][1], f["hidden_size"], num_layers=f["num_layers"], bias=f["bias"],
                                  batch_first=True, bidirectional=f["bidirectional"])

    def code(f: Fields, s: Shapes) -> str:
        extra = ("" if f["num_layers"] == 1 else f", num_layers={f['num_layers']}") + \
            ("" if f["bias"] else ", bias=False") + (", bidirectional=True" if f["bidirectional"] else "")
        return f"nn.{name}({s[0][1]}, {f['hidden_size']}{extra}, batch_first=True)"

    return LayerType(
        name, "Recurrent",
        (_int("input_size", 0, 0, help=_AUTO), _int("hidden_size", 256, 1), _int("num_layers", 1, 1),
         _bool("bias", True), _bool("bidirectional", False)),
        1, 1, f"{name} over a (sequence, features) input, batch first; outputs every step's hidden state.",
        infer, params, None, build, code, keeps=keeps, call="first")


_register(_rnn_make("LSTM", 4, "lstm"))
_register(_rnn_make("GRU", 3, "gru"))


# ---------------------------------------------------------------- Attention

def _attn_check(f: Fields, s: Shapes, name: str, key: str = "embed_dim", heads: str = "num_heads") -> Shape:
    x = s[0]
    _rank(x, 2, "sequence × features", name)
    e = _channels(f, key, x[1], "features")
    if e % f[heads]:
        raise ShapeError(f"{heads} {f[heads]} does not divide the {e} features")
    return x


def _mha_code(f: Fields, s: Shapes) -> str:
    extra = ("" if f["dropout"] == 0 else f", dropout={f['dropout']!r}") + ("" if f["bias"] else ", bias=False")
    return f"nn.MultiheadAttention({s[0][1]}, {f['num_heads']}{extra}, batch_first=True)"


_register(LayerType(
    "MultiheadAttention", "Attention",
    (_int("embed_dim", 0, 0, help=_AUTO), _int("num_heads", 8, 1), _float("dropout", 0.0, 0.0, 1.0),
     _bool("bias", True)),
    1, 1, "Self-attention over a (sequence, features) input: query = key = value = the input.",
    lambda f, s: _attn_check(f, s, "MultiheadAttention"),
    lambda f, s: 4 * s[0][1] ** 2 + (4 * s[0][1] if f["bias"] else 0), None,
    lambda f, s: nn.MultiheadAttention(s[0][1], f["num_heads"], dropout=f["dropout"], bias=f["bias"],
                                       batch_first=True),
    _mha_code, keeps="attention", call="self_attn",
    _formula=lambda f, s: f"4·{s[0][1]}²" + (f" + 4·{s[0][1]}" if f["bias"] else "") + " (in/out projections)"))


def _pos_infer(f: Fields, s: Shapes) -> Shape:
    x = s[0]
    _rank(x, 2, "sequence × features", "PositionalEmbedding")
    if f["max_len"] and x[0] > f["max_len"]:
        raise ShapeError(f"sequence of {x[0]} is longer than max_len {f['max_len']}")
    return x


_register(LayerType(
    "PositionalEmbedding", "Attention", (_int("max_len", 0, 0, help="longest sequence; " + _AUTO),), 1, 1,
    "Adds a learned vector per position to a (sequence, features) input (GPT/ViT style).",
    _pos_infer, lambda f, s: (f["max_len"] or s[0][0]) * s[0][1], None,
    lambda f, s: PositionalEmbedding(f["max_len"] or s[0][0], s[0][1]),
    lambda f, s: f"PositionalEmbedding({f['max_len'] or s[0][0]}, {s[0][1]})", keeps="nothing"))


def _block_params(f: Fields, s: Shapes) -> int:
    e, ff = s[0][1], f["dim_feedforward"]
    return int((4 * e * e + 4 * e) + (e * ff + ff) + (ff * e + e) + 4 * e)


def _block_formula(f: Fields, s: Shapes) -> str:
    e, ff = s[0][1], f["dim_feedforward"]
    return f"attention 4·{e}²+4·{e} + FF 2·{e}·{ff}+{ff}+{e} + 2 LayerNorms 4·{e}"


def _block_make(name: str, causal: bool) -> LayerType:
    cls_name = "CausalTransformerBlock" if causal else "nn.TransformerEncoderLayer"
    cls: type[nn.TransformerEncoderLayer] = CausalTransformerBlock if causal else nn.TransformerEncoderLayer

    def build(f: Fields, s: Shapes) -> nn.Module:
        return cls(s[0][1], f["nhead"], dim_feedforward=f["dim_feedforward"], dropout=f["dropout"],
                   activation=f["activation"], batch_first=True, norm_first=f["norm_first"])

    def code(f: Fields, s: Shapes) -> str:
        return (f"{cls_name}({s[0][1]}, {f['nhead']}, dim_feedforward={f['dim_feedforward']}, "
                f"dropout={f['dropout']!r}, activation={f['activation']!r}, batch_first=True"
                + (", norm_first=True" if f["norm_first"] else "") + ")")

    desc = ("A decoder-only (GPT-style) block: causal self-attention + feed-forward, each with a residual and "
            "LayerNorm. There is no cross-attention (no encoder memory), so it has the encoder layer's parameters."
            if causal else "Self-attention + feed-forward, each with a residual and LayerNorm (batch first).")
    return LayerType(
        name, "Attention",
        (_int("d_model", 0, 0, help=_AUTO), _int("nhead", 8, 1), _int("dim_feedforward", 2048, 1),
         _float("dropout", 0.1, 0.0, 1.0), _choice("activation", "relu", ("relu", "gelu")),
         _bool("norm_first", False)),
        1, 1, desc, lambda f, s: _attn_check(f, s, name, "d_model", "nhead"), _block_params, None, build, code,
        keeps="transformer", _formula=_block_formula)


_register(_block_make("TransformerEncoderLayer", False))
_register(_block_make("TransformerDecoderLayer", True))


# ---------------------------------------------------------------- Merge

def _add_infer(f: Fields, s: Shapes) -> Shape:
    first = s[0]
    for other in s[1:]:
        if other != first:
            raise ShapeError(f"Add needs equal shapes, got {fmt_shape(first)} and {fmt_shape(other)}")
    return first


def _concat_infer(f: Fields, s: Shapes) -> Shape:
    first = s[0]
    r = len(first) + 1
    d = _norm_dim(f["dim"], r, "dim")
    total = 0
    for other in s:
        if len(other) != len(first) or any(a != b for i, (a, b) in enumerate(zip(first, other, strict=True))
                                           if i != d):
            raise ShapeError(f"Concat along dim {f['dim']} needs the other dimensions equal, got "
                             f"{fmt_shape(first)} and {fmt_shape(other)}")
        total += other[d]
    return first[:d] + (total,) + first[d + 1:]


_register(LayerType(
    "Add", "Merge", (), 2, None, "Sums its inputs (residual connections); shapes must be equal.",
    _add_infer, _none_params, None, lambda f, s: Add(), lambda f, s: "Add()", keeps="merge", call="merge"))

_register(LayerType(
    "Concat", "Merge", (_int("dim", 1, help="dimension to join along (batch = 0; 1 = channels)"),), 2, None,
    "Concatenates its inputs along one dimension (U-Net skips, branches).",
    _concat_infer, _none_params, None, lambda f, s: Concat(f["dim"]),
    lambda f, s: f"Concat(dim={f['dim']})", keeps="merge", call="merge"))


# ---------------------------------------------------------------- queries and validation

GROUP_ORDER = ("Input/Output", "Linear", "Convolution", "Normalization", "Activation", "Pooling", "Shape",
               "Recurrent", "Attention", "Merge")


def groups() -> dict[str, list[str]]:
    """Group name → layer type names, in palette order."""
    out: dict[str, list[str]] = {g: [] for g in GROUP_ORDER}
    for name, lt in CATALOGUE.items():
        out.setdefault(lt.group, []).append(name)
    return {g: names for g, names in out.items() if names}


def layer_type(type_name: str) -> LayerType:
    try:
        return CATALOGUE[type_name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(str(type_name), list(CATALOGUE), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UserError(f"unknown layer type '{type_name}'{hint}") from None


def validate_field(type_name: str, field_name: str, value: object) -> FieldValue:
    """Coerce a field value; UserError with the reason, e.g. "kernel_size must be ≥ 1"."""
    spec = layer_type(type_name).spec(field_name)
    try:
        return coerce_field(spec, value)
    except ValueError as e:
        raise UserError(f"{field_name} {e}") from None
