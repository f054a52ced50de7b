"""Closed-form memory figures of a sketch from its shapes alone (instant builder feedback), with their formulas.

Per layer: parameters, gradients, optimizer state and the activations autograd saves for backward (what each
op really keeps, checked against torch.autograd.graph.saved_tensors_hooks); then a layer-by-layer walk of
forward, backward and the optimizer step gives an approximate peak. Also the seeds' pure-math helpers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .catalogue import CATALOGUE, Fields, KeepRule, Shape, conv_out_len
from .config import TrainConfig
from .errors import UserError
from .optimizers import OPTIMIZER_TABLE
from .results import CATEGORIES, Estimate, ModuleRow, PhaseSpan, TimelinePoint
from .sketch import Sketch, checkpoint_node_ids

IntOrInts = int | tuple[int, ...] | list[int]  # a size given once for every dimension, or per dimension

# ---------------------------------------------------------------- pure-math helpers (no sketch needed)

def dtype_bytes(precision: str) -> int:
    """Bytes per element of parameters for a precision: fp32 and amp-* 4 (fp32 weights), fp16/bf16 2."""
    if precision in ("fp16", "bf16"):
        return 2
    if precision in ("fp32", "amp-fp16", "amp-bf16"):
        return 4
    raise UserError(f"unknown precision '{precision}'")


def optimizer_state_bytes(n_params: int, optimizer: str, precision: str = "fp32") -> int:
    """State the optimizer keeps: sgd 0, sgd-momentum 1×, adam/adamw 2×, rmsprop 1×, adagrad 1× the params
    (in the parameters' dtype: fp32 under AMP, whose parameters are the fp32 master weights)."""
    if optimizer not in OPTIMIZER_TABLE:
        raise UserError(f"unknown optimizer '{optimizer}'")
    spec = OPTIMIZER_TABLE[optimizer]
    return spec.state_per_param * n_params * (spec.state_bytes or dtype_bytes(precision))


def linear_params(in_features: int, out_features: int, bias: bool = True) -> int:
    """in·out + out: Linear(512, 256) = 131,328."""
    return in_features * out_features + (out_features if bias else 0)


def conv_params(in_channels: int, out_channels: int, kernel_size: IntOrInts, groups: int = 1, bias: bool = True) -> int:
    """out·(in/groups)·∏k + out: Conv2d(3, 64, 3) = 1,792; Conv2d(64, 128, 3) = 73,856."""
    k = kernel_size if isinstance(kernel_size, (tuple, list)) else (kernel_size, kernel_size)
    return out_channels * (in_channels // groups) * math.prod(k) + (out_channels if bias else 0)


def batchnorm_params(num_features: int) -> tuple[int, int]:
    """(parameters, buffer elements): weight + bias = 2C; running mean + var (2C) and a step counter."""
    return 2 * num_features, 2 * num_features + 1


def conv_output_shape(in_size: IntOrInts, kernel_size: IntOrInts, stride: IntOrInts = 1, padding: IntOrInts = 0,
                      dilation: IntOrInts = 1) -> tuple[int, ...]:
    """Spatial output size: floor((n + 2p − d(k−1) − 1)/s) + 1 per dimension; 224, k7, s2, p3 → 112."""
    sizes = tuple(in_size) if isinstance(in_size, (tuple, list)) else (in_size,)
    n = len(sizes)

    def rep(v: IntOrInts) -> tuple[int, ...]:
        return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n

    return tuple(conv_out_len(s, k, st, p, d) for s, k, st, p, d in
                 zip(sizes, rep(kernel_size), rep(stride), rep(padding), rep(dilation), strict=False))


def tensor_bytes(shape: Sequence[int], bytes_per_element: int = 4) -> int:
    """∏shape · bytes: 64×64×112×112 fp32 = 205,520,896 B (≈196 MiB)."""
    return math.prod(shape) * bytes_per_element


# ---------------------------------------------------------------- results

@dataclass(frozen=True)
class NodeFigures:
    node_id: str
    type: str
    output_shape: Shape | None  # without the batch dimension
    error: str | None
    parameters: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    saved_activation_bytes: int  # bytes this node allocates in forward that autograd keeps for backward
    output_bytes: int  # its output tensor (0 for views such as Flatten)
    formulas: dict[str, str] = field(default_factory=dict)  # figure name → human-readable formula

    @property
    def total_bytes(self) -> int:
        return self.parameter_bytes + self.buffer_bytes + self.gradient_bytes + self.optimizer_bytes + \
            self.saved_activation_bytes


# One step of the layer-by-layer walk: (phase, node id, {category: bytes}).
TimelineEntry = tuple[str, str, dict[str, int]]


@dataclass(frozen=True)
class AnalyticResult:
    config: TrainConfig
    nodes: dict[str, NodeFigures]  # node id → its figures, in topological order
    parameters: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    saved_activation_bytes: int
    input_bytes: int
    peak_bytes: int
    peak_phase: str  # "forward" | "backward" | "optimizer"
    peak_node: str  # the node being run at the peak ('' in the optimizer step)
    breakdown_at_peak: dict[str, int]  # category → bytes (engine.results.CATEGORIES), adds up to peak_bytes
    formulas: dict[str, str]
    notes: tuple[str, ...]
    errors: dict[str, str]  # node id → reason, for nodes without a shape (left out of the totals)
    timeline: tuple[TimelineEntry, ...] = ()  # each step of the layer-by-layer walk

    @property
    def error_message(self) -> str:
        """Why the sketch has no whole-model figures, in the words the traced estimate uses ('' when it has)."""
        for nid, reason in self.errors.items():  # topological order: the first is the cause, the rest depend on it
            if reason and not reason.startswith("depends on "):
                kind = self.nodes[nid].type if nid in self.nodes else None
                return str(UserError(reason, where=f"node '{nid}'" + (f" ({kind})" if kind else "")))
        return next((f"node '{n}': {r}" for n, r in self.errors.items()), "")

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "nodes": {k: {**v.__dict__, "output_shape": list(v.output_shape) if v.output_shape else None}
                      for k, v in self.nodes.items()},
            "parameters": self.parameters,
            "parameter_bytes": self.parameter_bytes,
            "buffer_bytes": self.buffer_bytes,
            "gradient_bytes": self.gradient_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "saved_activation_bytes": self.saved_activation_bytes,
            "input_bytes": self.input_bytes,
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "peak_node": self.peak_node,
            "breakdown_at_peak": dict(self.breakdown_at_peak),
            "formulas": dict(self.formulas),
            "notes": list(self.notes),
            "errors": dict(self.errors),
            "timeline": [{"phase": ph, "node": n, "by_category": dict(c)} for ph, n, c in self.timeline],
        }

    def to_estimate(self, model_name: str = "sketch") -> Estimate:
        """The same figures as an engine.results.Estimate (source "analytic"), for views that render estimates."""
        peak = self.peak_bytes or 1
        grads_at_peak = self.breakdown_at_peak.get("gradients", 0) > 0
        rows = []
        for f in self.nodes.values():
            if f.type in ("Input", "Output") or f.error:
                continue
            at_peak = f.parameter_bytes + f.buffer_bytes + f.optimizer_bytes + f.saved_activation_bytes + \
                (f.gradient_bytes if grads_at_peak else 0)
            rows.append(ModuleRow(f.node_id, f.type, f.parameters, f.parameter_bytes, f.gradient_bytes,
                                  f.optimizer_bytes, f.saved_activation_bytes, at_peak, at_peak / peak))
        points = tuple(TimelinePoint(i, 1, ph, n, "", _categories(c)) for i, (ph, n, c) in enumerate(self.timeline))
        spans: list[PhaseSpan] = []
        start = 0
        for i in range(1, len(points) + 1):
            if i == len(points) or points[i].phase != points[start].phase:
                spans.append(PhaseSpan(1, points[start].phase, start, i - 1))
                start = i
        peak_index = next((p.index for p in points if p.total == self.peak_bytes), 0)
        return Estimate(
            model_name=model_name, config=self.config, parameters=self.parameters,
            trainable_parameters=self.parameters, peak_bytes=self.peak_bytes, peak_index=peak_index, peak_step=1,
            peak_phase=self.peak_phase, peak_module=self.peak_node, peak_op="",
            breakdown_at_peak=dict(self.breakdown_at_peak), per_module=tuple(rows), timeline=points,
            phases=tuple(spans), source="analytic", notes=self.notes)


# ---------------------------------------------------------------- per-layer saving rules

HALF = 2  # bytes per element of fp16/bf16: what autocast computes matmuls and convolutions in

Extra = tuple[str, int, str]  # (label, bytes, formula) of a tensor a node allocates and autograd keeps


def _n(x: int) -> str:
    return f"{x:,}"


def _dims(shape: Sequence[int], b: int, eb: int) -> str:
    return "·".join(str(d) for d in (b, *shape)) + f"·{eb} B"


@dataclass
class _Rule:
    saves_inputs: tuple[int, ...] = ()  # ports whose tensors autograd keeps (owned by their producers)
    saves_output: bool = False
    extras: list[Extra] = field(default_factory=list)  # tensors this node allocates and keeps
    out_elem: int = 4
    fwd_scratch: int = 0  # transient bytes inside the forward kernel
    bwd_scratch: int = 0  # transient bytes inside the backward kernel
    recompute: int = 0  # checkpointed: bytes its forward re-creates during backward


@dataclass(frozen=True)
class RuleArgs:
    """One layer as its rule sees it: fields, input and output shapes (without the batch), the batch size,
    the bytes per element of its inputs, the configuration, and whether its input needs a gradient."""

    f: Fields
    ins: tuple[Shape, ...]
    out: Shape
    b: int
    in_elem: tuple[int, ...]
    cfg: TrainConfig
    in_grad: bool = True

    @property
    def e0(self) -> int:
        """Bytes per element of the first input (4 without one)."""
        return self.in_elem[0] if self.in_elem else 4

    @property
    def matmul_elem(self) -> int:
        """Output bytes per element of a matmul or convolution: autocast runs these in half precision."""
        return HALF if self.cfg.amp else self.e0

    @property
    def norm_elem(self) -> int:
        """Output bytes per element of a norm or softmax: CUDA autocast runs these in fp32; the CPU keeps the
        input's dtype."""
        return 4 if self.cfg.amp and self.cfg.device == "cuda" else self.e0

    @property
    def numel_out(self) -> int:
        return self.b * math.prod(self.out) if self.out else 0

    def rows(self, shape: Shape) -> int:
        """Rows of a tensor normalized over its last dimension (the batch included)."""
        return self.b * math.prod(shape[:-1])


def _autocast_copies(x: RuleArgs, r: _Rule, weights: int, copies_input: bool = False) -> None:
    """Under autocast a matmul keeps half-precision copies of its weights (`weights` elements, no biases) and,
    for Linear and convolutions, a half copy of an fp32 input instead of the input itself."""
    if not x.cfg.amp:
        return
    if copies_input and x.e0 == 4:
        r.saves_inputs = ()
        n_in = x.b * math.prod(x.ins[0])
        r.extras.append(("half copy of the input", n_in * HALF, _dims(x.ins[0], x.b, HALF)))
    r.extras.append(("half copy of the weights", weights * HALF, f"{_n(weights)}·{HALF} B"))


# What autograd keeps for one layer in training, by the rule its catalogue entry names (LayerType.keeps);
# measured on PyTorch's CPU kernels, noted where CUDA differs.

def _keeps_nothing(x: RuleArgs) -> _Rule:
    return _Rule(out_elem=x.e0)


def _source(x: RuleArgs) -> _Rule:
    """The model's input (analytic() sizes it from the Input's dtype)."""
    return _Rule(out_elem=4)


def _merge(x: RuleArgs) -> _Rule:
    """Add and Concat keep nothing; their output takes the widest input's dtype."""
    return _Rule(out_elem=max(x.in_elem))


def _keeps_input(x: RuleArgs) -> _Rule:
    return _Rule(saves_inputs=(0,), out_elem=x.e0)


def _keeps_output(x: RuleArgs) -> _Rule:
    return _Rule(saves_output=True, out_elem=x.e0)


def _softmax(x: RuleArgs) -> _Rule:
    return _Rule(saves_output=True, out_elem=x.norm_elem)


def _linear(x: RuleArgs) -> _Rule:
    r = _Rule(saves_inputs=(0,), out_elem=x.matmul_elem)
    _autocast_copies(x, r, x.ins[0][-1] * x.f["out_features"], copies_input=True)
    return r


def _kernel_elems(f: Fields, ins: Shape) -> int:
    """∏k of a convolution's kernel over the input's spatial dimensions (a single size stands for each of them)."""
    k = tuple(f["kernel_size"])
    return math.prod(k * (len(ins) - 1) if len(k) == 1 else k)


def _conv(x: RuleArgs) -> _Rule:
    r = _Rule(saves_inputs=(0,), out_elem=x.matmul_elem)
    f, ins = x.f, x.ins
    if x.cfg.device == "cpu":
        r.fwd_scratch, r.bwd_scratch = _onednn_conv_scratch(ins[0], x.out, x.b, r.out_elem, f,
                                                            x.in_grad and x.cfg.training)
    _autocast_copies(x, r, ins[0][0] * f["out_channels"] // f["groups"] * _kernel_elems(f, ins[0]), copies_input=True)
    return r


def _batchnorm(x: RuleArgs) -> _Rule:
    c = x.ins[0][0]
    return _Rule(saves_inputs=(0,), out_elem=x.e0, extras=[("batch mean + inv. std", 2 * c * 4, f"2·{c}·4 B")])


def _layernorm(x: RuleArgs) -> _Rule:
    n = x.rows(x.ins[0])
    return _Rule(saves_inputs=(0,), out_elem=x.norm_elem, extras=[("mean + rstd per row", 2 * n * 4, f"2·{_n(n)}·4 B")])


def _rmsnorm(x: RuleArgs) -> _Rule:
    n, eb = x.rows(x.ins[0]), x.norm_elem
    return _Rule(saves_inputs=(0,), out_elem=eb, extras=[("rstd per row", n * 4, f"{_n(n)}·4 B"),
                                                         ("x·rstd", x.numel_out * eb, _dims(x.out, x.b, eb))])


def _groupnorm(x: RuleArgs) -> _Rule:
    b, g = x.b, x.f["num_groups"]
    return _Rule(saves_inputs=(0,), out_elem=x.norm_elem,
                 extras=[("mean + rstd per group", 2 * b * g * 4, f"2·{b}·{g}·4 B")])


def _dropout(x: RuleArgs) -> _Rule:
    r = _Rule(out_elem=x.e0)
    if x.f["p"] > 0:
        # CUDA's fused kernel keeps a bool mask (1 B); the CPU path multiplies by a saved float mask.
        mb = 1 if x.cfg.device == "cuda" else r.out_elem
        r.extras.append(("dropout mask", x.numel_out * mb, _dims(x.out, x.b, mb)))
    return r


def _maxpool(x: RuleArgs) -> _Rule:
    return _Rule(saves_inputs=(0,), out_elem=x.e0, extras=[("int64 indices", x.numel_out * 8, _dims(x.out, x.b, 8))])


def _adaptive_avg(x: RuleArgs) -> _Rule:
    # A 1×1 output runs as mean(), which keeps nothing.
    return _Rule(saves_inputs=() if tuple(x.out[1:]) == (1, 1) else (0,), out_elem=x.e0)


def _embedding(x: RuleArgs) -> _Rule:
    """An Embedding keeps its token ids (an input tensor); its output has the parameters' dtype."""
    return _Rule(saves_inputs=(0,), out_elem=dtype_bytes(x.cfg.precision))


def _rnn_weights(x: RuleArgs, gates: int) -> int:
    f, e = x.f, x.ins[0][-1]
    h, dirs = f["hidden_size"], 2 if f["bidirectional"] else 1
    return sum(dirs * gates * h * ((e if i == 0 else h * dirs) + h) for i in range(f["num_layers"]))


def _lstm(x: RuleArgs) -> _Rule:
    r = _Rule(saves_output=True, out_elem=x.matmul_elem)
    (seq, feat), b, eb = x.ins[0], x.b, r.out_elem
    h, layers = x.f["hidden_size"], x.f["num_layers"]
    dirs = 2 if x.f["bidirectional"] else 1
    r.extras.append(("input copy", b * seq * feat * eb, f"{b}·{seq}·{feat}·{eb} B"))
    r.extras.append(("h/c states", 4 * layers * dirs * b * h * eb, f"4·{layers}·{dirs}·{b}·{h}·{eb} B"))
    ws = 15 * (seq + 1) * b * h * 4 * layers * dirs
    r.extras.append(("kernel workspace (≈15·(T+1)·B·H·4 B per layer and direction)", ws,
                     f"15·{seq + 1}·{b}·{h}·4 B·{layers * dirs}"))
    if layers > 1:
        mid = (layers - 1) * b * seq * h * dirs * eb
        r.extras.append(("inner layers' outputs", mid, f"{layers - 1}·{b}·{seq}·{h * dirs}·{eb} B"))
    _autocast_copies(x, r, _rnn_weights(x, 4))
    return r


def _gru(x: RuleArgs) -> _Rule:
    r = _Rule(out_elem=x.matmul_elem)
    (seq, feat), b, eb = x.ins[0], x.b, r.out_elem
    h, layers = x.f["hidden_size"], x.f["num_layers"]
    dirs = 2 if x.f["bidirectional"] else 1
    total, parts = 0, []
    for layer in range(layers):
        i = feat if layer == 0 else h * dirs
        total += dirs * (b * seq * i + seq * 7 * b * h) * eb
        parts.append(f"{dirs}·({b}·{seq}·{i} + 7·{seq}·{b}·{h})·{eb} B")
    r.extras.append(("layer inputs + gates per step", total, " + ".join(parts)))
    _autocast_copies(x, r, _rnn_weights(x, 3))
    return r


def _self_attention(x: RuleArgs) -> _Rule:
    r = _Rule(out_elem=x.matmul_elem)
    seq, e = x.ins[0]
    r.extras.extend(_attention(x.b, seq, e, x.f["num_heads"], x.f["dropout"], r.out_elem, x.cfg))
    _autocast_copies(x, r, 4 * e * e)
    return r


def _transformer(x: RuleArgs) -> _Rule:
    f, b, amp = x.f, x.b, x.cfg.amp
    seq, e = x.ins[0]
    ff, p, heads = f["dim_feedforward"], f["dropout"], f["nhead"]
    # under autocast the linear layers work in 2 B, while the residual stream stays fp32
    lo = x.matmul_elem
    res = 4 if amp else x.e0
    r = _Rule(out_elem=res)
    ext = r.extras
    n = b * seq
    ext.extend(_attention(b, seq, e, heads, p, lo, x.cfg))
    mb = 1 if x.cfg.device == "cuda" else lo
    if f["norm_first"]:
        r.saves_inputs = (0,)  # the first LayerNorm reads the block input
        ext.append(("residual sum + FF input", n * e * (res + lo), f"{n}·{e}·({res} + {lo}) B"))
    else:
        ext.append(("2 residual sums + FF input", n * e * (2 * res + lo), f"{n}·{e}·(2·{res} + {lo}) B"))
    ext.append(("LayerNorm mean + rstd ×2", 4 * n * 4, f"4·{_n(n)}·4 B"))
    # GELU keeps its input and the next op keeps its output; with dropout between, that output is freed
    acts = 2 if f["activation"] == "gelu" and p == 0 else 1
    ext.append(("feed-forward hidden", acts * n * ff * lo, f"{acts}·{n}·{ff}·{lo} B"))
    if p > 0:
        ext.append(("dropout masks (attn out, FF, FF out)", (2 * n * e + n * ff) * mb,
                    f"(2·{n}·{e} + {n}·{ff})·{mb} B"))
        ext.append(("FF dropout output", n * ff * lo, f"{n}·{ff}·{lo} B"))
    _autocast_copies(x, r, 4 * e * e + 2 * e * ff)
    return r


# One function per rule a catalogue entry can name (engine.catalogue.KeepRule); tests/test_catalogue.py checks
# that every kind has its function here and every function is named by some layer type.
LAYER_RULES: dict[KeepRule, Callable[[RuleArgs], _Rule]] = {
    "nothing": _keeps_nothing, "source": _source, "merge": _merge, "input": _keeps_input, "output": _keeps_output,
    "softmax": _softmax, "linear": _linear, "conv": _conv, "batchnorm": _batchnorm, "layernorm": _layernorm,
    "rmsnorm": _rmsnorm, "groupnorm": _groupnorm, "dropout": _dropout, "maxpool": _maxpool,
    "adaptive_avg": _adaptive_avg, "embedding": _embedding, "lstm": _lstm, "gru": _gru,
    "attention": _self_attention, "transformer": _transformer,
}
# Layers whose fused kernels the formulas above only approximate (said in the result's notes).
_APPROXIMATE: frozenset[KeepRule] = frozenset({"lstm", "gru", "attention", "transformer"})


def _pad16(c: int) -> int:
    return -(-c // 16) * 16


def _onednn_channel_block() -> int:
    """oneDNN blocks channels by the vector width: 16 floats with AVX-512, 8 with AVX2 (measured: LeNet's first
    convolution, 1 → 6 channels, keeps a 16-channel output buffer on an AVX-512 Xeon, an 8-channel one on AVX2)."""
    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


def _onednn_conv_scratch(ins: Shape, out: Shape, b: int, eb: int, f: Fields, input_needs_grad: bool
                         ) -> tuple[int, int]:
    """oneDNN (the CPU's convolution library) works in a channel-blocked layout: forward writes a blocked
    output and reorders weights; backward keeps blocked copies of grad-output and grad-input, or a blocked
    weight gradient when that is larger. Sizes follow measurements of PyTorch's CPU kernels with the
    profiler (within a few % on common shapes); 16-bit convolutions use an im2col column buffer instead."""
    spatial_out, spatial_in = math.prod(out[1:]), math.prod(ins[1:])
    k = _kernel_elems(f, ins)
    if eb == 2:
        # 16-bit convolutions on the CPU take the im2col path: one column buffer of C·∏k × output positions
        cols = b * ins[0] * k * spatial_out * eb
        return cols, cols
    weight: int = f["out_channels"] * ins[0] * k * eb
    c_in, c_out = ins[0], out[0]
    block = _onednn_channel_block()
    out_b = b * (-(-c_out // block) * block) * spatial_out * eb
    stride = f["stride"] if isinstance(f["stride"], (tuple, list)) else (f["stride"],)
    # oneDNN's forward picks its layouts by shape: measured, a plain output buffer when channels grow,
    # plus a reordered weight when they stay, and a second output-sized buffer when they shrink or stride.
    if c_in > c_out or any(st > 1 for st in stride):
        fwd = 2 * out_b + weight + (b * c_in * spatial_in * eb if c_out < 8 else 0)
    elif c_in == c_out:
        fwd = out_b + weight
    else:
        fwd = out_b
    bwd = b * _pad16(out[0]) * spatial_out * eb + (b * _pad16(ins[0]) * spatial_in * eb if input_needs_grad else 0)
    return fwd, max(bwd, weight)  # small feature maps: the weight gradient's blocked buffer dominates


def _attention(b: int, seq: int, e: int, heads: int, p: float, eb: int, cfg: TrainConfig) -> list[Extra]:
    """Self-attention (batch first): a contiguous copy of the input for the packed in-projection, q/k/v,
    the attention output, and either the fused kernel's log-sum-exp or, with dropout on the CPU, the
    math path's T×T matrices (which CPU autocast computes in fp32)."""
    n = b * seq
    if p > 0 and cfg.device == "cpu":
        mid = 4 if cfg.amp else eb
        tt = b * heads * seq * seq * mid
        qkv = 3 * n * e * mid if cfg.amp else 5 * n * e * mid  # fp32: q, k and the packed qkv
        return [("attention: input copy + output", 2 * n * e * eb, f"2·{n}·{e}·{eb} B"),
                ("attention: q, k, v", qkv, f"{qkv // (n * e * mid)}·{n}·{e}·{mid} B"),
                ("attention: scores, dropout mask, dropped weights (T×T per head)", 3 * tt,
                 f"3·{b}·{heads}·{seq}·{seq}·{mid} B")]
    lse = b * heads * seq * 4
    return [("attention: input copy, qkv, output", 5 * n * e * eb, f"5·{n}·{e}·{eb} B"),
            ("attention: log-sum-exp", lse, f"{b}·{heads}·{seq}·4 B")]


# ---------------------------------------------------------------- the estimate

def analytic(sketch: Sketch, cfg: TrainConfig | None = None) -> AnalyticResult:
    cfg = cfg or TrainConfig()
    b = cfg.batch_size
    train = cfg.training
    pb = dtype_bytes(cfg.precision)
    act_b = 2 if cfg.precision in ("fp16", "bf16") else 4
    opt = cfg.optimizer if train else "none"
    k_state = OPTIMIZER_TABLE[opt].state_per_param

    shapes = sketch.infer_shapes(b)
    order = list(shapes)
    in_edges = {n: [e.src for e in es] for n, es in sketch.incoming().items()}

    ckpt: set[str] = set()
    if train and cfg.checkpointing:
        ckpt = set(checkpoint_node_ids(sketch))
    owner: dict[str, str] = {}  # node → the node whose storage its output is
    elem: dict[str, int] = {}
    size: dict[str, int] = {}  # bytes of each owned output tensor
    rules: dict[str, _Rule] = {}
    figures: dict[str, NodeFigures] = {}
    errors: dict[str, str] = {}
    input_bytes = 0
    for n in order:
        node, res = sketch.nodes[n], shapes[n]
        lt = CATALOGUE[node.type]
        if res.shape is None:
            errors[n] = res.error or ""
            figures[n] = NodeFigures(n, node.type, None, res.error, 0, 0, 0, 0, 0, 0, 0, {})
            continue
        srcs = in_edges[n]
        in_el = tuple(elem[s] for s in srcs)
        if node.type == "Input":
            eb = 8 if node.fields["dtype"] == "int64" else act_b
            owner[n], elem[n] = n, eb
            size[n] = b * math.prod(res.shape) * eb
            input_bytes += size[n]
            rules[n] = _Rule(out_elem=eb)
        else:
            in_grad = bool(srcs) and sketch.nodes[owner[srcs[0]]].type != "Input"
            rule = LAYER_RULES[lt.keeps](RuleArgs(node.fields, res.in_shapes, res.shape, b, in_el, cfg, in_grad))
            if not train:  # inference keeps nothing for backward
                rule = _Rule(out_elem=rule.out_elem, fwd_scratch=rule.fwd_scratch)
            elif n in ckpt:
                # checkpointed: only the block's input is kept; its internals come back in backward
                rule.recompute = sum(x[1] for x in rule.extras)
                rule.extras, rule.saves_inputs, rule.saves_output = [], (0,), False
            if lt.alias or (lt.keeps == "dropout" and (node.fields["p"] == 0 or not train)):
                owner[n], elem[n] = owner[srcs[0]], elem[srcs[0]]
            else:
                owner[n], elem[n] = n, rule.out_elem
                size[n] = b * math.prod(res.shape) * rule.out_elem
            rules[n] = rule
        params = res.params
        bufs = lt.buffer_bytes(node.fields, res.in_shapes, pb)
        grads = params * pb if train else 0
        state = k_state * params * pb
        fm: dict[str, str] = {}
        if params:
            how = lt.param_formula(node.fields, res.in_shapes)
            fm["parameters"] = f"{how} = {_n(params)}" if how else _n(params)
            fm["parameter_bytes"] = f"{_n(params)} · {pb} B = {_n(params * pb)} B"
            if train:
                fm["gradient_bytes"] = f"{_n(params)} · {pb} B = {_n(grads)} B"
                fm["optimizer_bytes"] = (f"{k_state} · {_n(params)} · {pb} B = {_n(state)} B "
                                         f"({OPTIMIZER_TABLE[opt].state_what})")
        if bufs:
            fm["buffer_bytes"] = f"{_n(bufs)} B (running mean/var + int64 step counter)"
        out_b = size.get(n, 0) if owner[n] == n else 0
        fm["output"] = (f"{_dims(res.shape, b, elem[n])} = {_n(b * math.prod(res.shape) * elem[n])} B"
                        + ("" if owner[n] == n else f" (a view of {owner[n]}'s output: no new memory)"))
        figures[n] = NodeFigures(n, node.type, res.shape, None, params, params * pb, bufs, grads, state, 0, out_b, fm)

    # which owned tensors autograd keeps, and by whom
    saved_by: dict[str, set[str]] = {}
    for n, r in rules.items():
        for port in r.saves_inputs:
            saved_by.setdefault(owner[in_edges[n][port]], set()).add(n)
        if r.saves_output:
            saved_by.setdefault(owner[n], set()).add(n)
    saved_bytes: dict[str, int] = {}
    for n in rules:
        if sketch.nodes[n].type == "Input":
            continue
        own = size[n] if (owner[n] == n and n in saved_by) else 0
        extra = sum(x[1] for x in rules[n].extras)
        saved_bytes[n] = own + extra
        if own or extra:
            parts = ([f"output {_n(own)} B (kept by {', '.join(sorted(saved_by[n]))})"] if own else []) + \
                [f"{lbl} {form} = {_n(v)} B" for lbl, v, form in rules[n].extras]
            figures[n].formulas["saved_activation_bytes"] = " + ".join(parts) + f" = {_n(own + extra)} B"
        figures[n] = replace(figures[n], saved_activation_bytes=own + extra)

    totals = {
        "parameters": sum(f.parameters for f in figures.values()),
        "parameter_bytes": sum(f.parameter_bytes for f in figures.values()),
        "buffer_bytes": sum(f.buffer_bytes for f in figures.values()),
        "gradient_bytes": sum(f.gradient_bytes for f in figures.values()),
        "optimizer_bytes": sum(f.optimizer_bytes for f in figures.values()),
        "saved_activation_bytes": sum(saved_bytes.values()),
    }
    peak, phase, at, breakdown, points = _walk(sketch, cfg, order, rules, owner, size, saved_by, in_edges, figures,
                                               totals, input_bytes, errors)
    formulas = {
        "parameter_bytes": f"{_n(totals['parameters'])} params · {pb} B = {_n(totals['parameter_bytes'])} B",
        "gradient_bytes": f"{_n(totals['parameters'])} · {pb} B = {_n(totals['gradient_bytes'])} B" if train
        else "0 B (inference keeps no gradients)",
        "optimizer_bytes": f"{k_state} · {_n(totals['parameters'])} · {pb} B = {_n(totals['optimizer_bytes'])} B "
                           f"({OPTIMIZER_TABLE[opt].state_what})",
        "peak_bytes": " + ".join(f"{k} {_n(v)} B" for k, v in breakdown.items() if v) + f" = {_n(peak)} B "
                      f"({phase}{', at ' + at if at else ''})",
    }
    notes = [
        "Analytic approximation from shapes: leaves out backward-kernel scratch, convolution/LSTM workspaces "
        "beyond those listed, allocator rounding and fragmentation, and (on a GPU) the CUDA context.",
    ]
    if cfg.amp:
        notes.append("AMP: fp32 parameters, gradients and optimizer state (the master weights); matmul/conv "
                     "outputs in 2 B; half-precision copies of weights used in forward counted as activations.")
    if cfg.checkpointing and train:
        notes.append(f"Activation checkpointing: {len(ckpt)} repeated block(s) keep only their inputs and are "
                     "recomputed in backward" + (" (" + ", ".join(sorted(ckpt)) + ")" if ckpt else
                                                 "; the sketch has no repeated composite blocks to wrap"))
    if cfg.grad_accum > 1:
        notes.append(f"Gradient accumulation ({cfg.grad_accum} steps): gradients stay allocated through forward.")
    if any(CATALOGUE[sketch.nodes[n].type].keeps in _APPROXIMATE for n in order if n not in errors):
        notes.append("Recurrent and attention layers use approximate formulas for their fused kernels.")
    if errors:
        notes.append(f"{len(errors)} node(s) without a shape are left out: " + ", ".join(errors))
    return AnalyticResult(cfg, figures, totals["parameters"], totals["parameter_bytes"], totals["buffer_bytes"],
                          totals["gradient_bytes"], totals["optimizer_bytes"], totals["saved_activation_bytes"],
                          input_bytes, peak, phase, at, breakdown, formulas, tuple(notes), errors, points)


def _walk(sketch: Sketch, cfg: TrainConfig, order: list[str], rules: dict[str, _Rule], owner: dict[str, str],
          size: dict[str, int], saved_by: dict[str, set[str]], in_edges: dict[str, list[str]],
          figures: dict[str, NodeFigures], totals: dict[str, int], input_bytes: int, errors: dict[str, str]
          ) -> tuple[int, str, str, dict[str, int], tuple[TimelineEntry, ...]]:
    """Live bytes layer by layer through forward, backward and the optimizer step: the peak (bytes, phase, node,
    bytes by category) and the timeline."""
    train = cfg.training
    ok = [n for n in order if n not in errors]
    P, B_, G, OPT = (totals["parameter_bytes"], totals["buffer_bytes"], totals["gradient_bytes"],
                   totals["optimizer_bytes"])
    graph_outputs = {owner[n] for n in sketch.output_ids() if n in owner} if ok else set()
    extras = {n: sum(x[1] for x in rules[n].extras) for n in ok}
    is_input = {n for n in ok if sketch.nodes[n].type == "Input"}
    best: tuple[int, str, str, dict[str, int]] = (0, "forward", "", {})
    points: list[TimelineEntry] = []

    def record(phase: str, node: str, cats: dict[str, int]) -> None:
        nonlocal best
        points.append((phase, node, _categories(cats)))
        total = sum(cats.values())
        if total > best[0]:
            best = (total, phase, node, dict(cats))

    # forward: the step's second iteration, when optimizer state (and, accumulating, gradients) exist
    grads_fwd = G if (train and cfg.grad_accum > 1) else 0
    base = {"parameters": P, "buffers": B_, "gradients": grads_fwd, "optimizer_state": OPT, "inputs": input_bytes}
    last_use: dict[str, str] = {}
    for n in ok:
        for s in in_edges[n]:
            if s in owner:
                last_use[owner[s]] = n
    release: dict[str, list[str]] = {}
    for t, n in last_use.items():
        release.setdefault(n, []).append(t)
    live = 0
    alive: set[str] = set()
    for n in ok:
        if n in is_input:
            continue
        if owner[n] == n:
            live += size[n]
            alive.add(n)
        live += extras[n] if train else 0
        record("forward", n, {**base, "activations": live, "temporaries": rules[n].fwd_scratch})
        for t in release.get(n, ()):
            if t in alive and t not in graph_outputs and not (train and t in saved_by):
                live -= size[t]
                alive.discard(t)
    if not train:
        return best[0], best[1], best[2], _categories(best[3]), tuple(points)

    # backward: reverse order; gradients of parameters appear, saved tensors go as their nodes finish
    # the step drops its reference to the output once the loss is taken; only what autograd saved stays
    for t in graph_outputs:
        if t in alive and t not in saved_by:
            live -= size[t]
            alive.discard(t)
    remaining = {t: set(v) for t, v in saved_by.items()}
    keeps: dict[str, list[str]] = {}  # node → the tensors it saves
    for t, savers in saved_by.items():
        for n in savers:
            keeps.setdefault(n, []).append(t)
    grad_live: dict[str, int] = {}  # gradient w.r.t. each owned activation, while it is live
    pgrads = 0
    act = live
    for n in reversed(ok):
        if n in is_input:
            continue
        merge = CATALOGUE[sketch.nodes[n].type].keeps == "merge"
        if owner[n] == n:
            # the gradient w.r.t. this output: the loss's is an expand() view (free); the rest were made
            # by the consumers' backward. Add/Concat hand it (or slices of it) on to their inputs as is.
            g = grad_live.pop(n, 0)
            for s in in_edges[n]:
                t = owner[s]
                if t in is_input or _is_ids(s, owner, sketch) or t in grad_live:
                    continue
                grad_live[t] = 0 if merge else size[t]
                if merge:
                    grad_live[t], g = g, 0
            pgrads += figures[n].gradient_bytes
            # accumulating, each new parameter gradient is a temporary added into the kept .grad
            acc = (figures[n].gradient_bytes if grads_fwd else 0) + rules[n].recompute
            record("backward", n, {**base, "gradients": grads_fwd or pgrads, "activations": act,
                                   "temporaries": sum(grad_live.values()) + g + rules[n].bwd_scratch + acc})
        else:
            pgrads += figures[n].gradient_bytes
        act -= extras[n]
        for t in keeps.get(n, ()):
            if t not in remaining:
                continue
            remaining[t].discard(n)
            if not remaining[t]:
                del remaining[t]
                if t in alive:
                    act -= size[t]
                    alive.discard(t)
    # optimizer step (steady state: all state allocated) with its transient buffers
    temp = _optimizer_temp(cfg, figures, ok)
    record("optimizer", "", {**base, "gradients": G, "activations": act, "temporaries": temp})
    return best[0], best[1], best[2], _categories(best[3]), tuple(points)


def _is_ids(n: str, owner: dict[str, str], sketch: Sketch) -> bool:
    node = sketch.nodes[owner[n]]
    return node.type == "Input" and bool(node.fields["dtype"] == "int64")


def _optimizer_temp(cfg: TrainConfig, figures: dict[str, NodeFigures], ok: list[str]) -> int:
    spec = OPTIMIZER_TABLE[cfg.optimizer]
    if spec.cpu_step_temporaries == 0:
        return 0
    pb = dtype_bytes(cfg.precision)
    if cfg.device == "cuda":
        # the foreach implementations build one sqrt() temporary for every parameter at once
        return sum(figures[n].parameters for n in ok) * pb
    # CPU runs per tensor: Adam's sqrt() and its quotient coexist for the largest tensor
    largest = max((figures[n].parameters for n in ok), default=0) * pb
    return spec.cpu_step_temporaries * largest


def _categories(d: dict[str, int]) -> dict[str, int]:
    return {c: int(d.get(c, 0)) for c in CATEGORIES}
