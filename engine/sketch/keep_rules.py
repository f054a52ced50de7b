"""What autograd keeps of one layer of a sketch in training, by the rule its catalogue entry names
(engine.sketch.layer_types.KeepRule): one function per rule in LAYER_RULES, measured on PyTorch's CPU kernels (checked
against torch.autograd.graph.saved_tensors_hooks), noted where CUDA differs; engine.sketch.analytic walks a sketch with
them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..config.train_config import TrainConfig
from .layer_math import dtype_bytes
from .layer_types import Fields, KeepRule, Shape

HALF = 2  # bytes per element of fp16/bf16: what autocast computes matmuls and convolutions in

Extra = tuple[str, int, str]  # (label, bytes, formula) of a tensor a node allocates and autograd keeps


def commas(x: int) -> str:
    return f"{x:,}"


def fmt_dims(shape: Sequence[int], b: int, eb: int) -> str:
    return "·".join(str(d) for d in (b, *shape)) + f"·{eb} B"


@dataclass
class Rule:
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


def _autocast_copies(x: RuleArgs, r: Rule, weights: int, copies_input: bool = False) -> None:
    """Under autocast a matmul keeps half-precision copies of its weights (`weights` elements, no biases) and,
    for Linear and convolutions, a half copy of an fp32 input instead of the input itself."""
    if not x.cfg.amp:
        return
    if copies_input and x.e0 == 4:
        r.saves_inputs = ()
        n_in = x.b * math.prod(x.ins[0])
        r.extras.append(("half copy of the input", n_in * HALF, fmt_dims(x.ins[0], x.b, HALF)))
    r.extras.append(("half copy of the weights", weights * HALF, f"{commas(weights)}·{HALF} B"))


# What autograd keeps for one layer in training, by the rule its catalogue entry names (LayerType.keeps);
# measured on PyTorch's CPU kernels, noted where CUDA differs.

def _keeps_nothing(x: RuleArgs) -> Rule:
    return Rule(out_elem=x.e0)


def _source(x: RuleArgs) -> Rule:
    """The model's input (analytic() sizes it from the Input's dtype)."""
    return Rule(out_elem=4)


def _merge(x: RuleArgs) -> Rule:
    """Add and Concat keep nothing; their output takes the widest input's dtype."""
    return Rule(out_elem=max(x.in_elem))


def _keeps_input(x: RuleArgs) -> Rule:
    return Rule(saves_inputs=(0,), out_elem=x.e0)


def _keeps_output(x: RuleArgs) -> Rule:
    return Rule(saves_output=True, out_elem=x.e0)


def _softmax(x: RuleArgs) -> Rule:
    return Rule(saves_output=True, out_elem=x.norm_elem)


def _linear(x: RuleArgs) -> Rule:
    r = Rule(saves_inputs=(0,), out_elem=x.matmul_elem)
    _autocast_copies(x, r, x.ins[0][-1] * x.f["out_features"], copies_input=True)
    return r


def _kernel_elems(f: Fields, ins: Shape) -> int:
    """∏k of a convolution's kernel over the input's spatial dimensions (a single size stands for each of them)."""
    k = tuple(f["kernel_size"])
    return math.prod(k * (len(ins) - 1) if len(k) == 1 else k)


def _conv(x: RuleArgs) -> Rule:
    r = Rule(saves_inputs=(0,), out_elem=x.matmul_elem)
    f, ins = x.f, x.ins
    if x.cfg.device == "cpu":
        r.fwd_scratch, r.bwd_scratch = _onednn_conv_scratch(ins[0], x.out, x.b, r.out_elem, f,
                                                            x.in_grad and x.cfg.training)
    _autocast_copies(x, r, ins[0][0] * f["out_channels"] // f["groups"] * _kernel_elems(f, ins[0]), copies_input=True)
    return r


def _batchnorm(x: RuleArgs) -> Rule:
    c = x.ins[0][0]
    return Rule(saves_inputs=(0,), out_elem=x.e0, extras=[("batch mean + inv. std", 2 * c * 4, f"2·{c}·4 B")])


def _layernorm(x: RuleArgs) -> Rule:
    n = x.rows(x.ins[0])
    return Rule(saves_inputs=(0,), out_elem=x.norm_elem,
                extras=[("mean + rstd per row", 2 * n * 4, f"2·{commas(n)}·4 B")])


def _rmsnorm(x: RuleArgs) -> Rule:
    n, eb = x.rows(x.ins[0]), x.norm_elem
    return Rule(saves_inputs=(0,), out_elem=eb, extras=[("rstd per row", n * 4, f"{commas(n)}·4 B"),
                                                         ("x·rstd", x.numel_out * eb, fmt_dims(x.out, x.b, eb))])


def _groupnorm(x: RuleArgs) -> Rule:
    b, g = x.b, x.f["num_groups"]
    return Rule(saves_inputs=(0,), out_elem=x.norm_elem,
                 extras=[("mean + rstd per group", 2 * b * g * 4, f"2·{b}·{g}·4 B")])


def _dropout(x: RuleArgs) -> Rule:
    r = Rule(out_elem=x.e0)
    if x.f["p"] > 0:
        # CUDA's fused kernel keeps a bool mask (1 B); the CPU path multiplies by a saved float mask.
        mb = 1 if x.cfg.device == "cuda" else r.out_elem
        r.extras.append(("dropout mask", x.numel_out * mb, fmt_dims(x.out, x.b, mb)))
    return r


def _maxpool(x: RuleArgs) -> Rule:
    return Rule(saves_inputs=(0,), out_elem=x.e0, extras=[("int64 indices", x.numel_out * 8, fmt_dims(x.out, x.b, 8))])


def _adaptive_avg(x: RuleArgs) -> Rule:
    # A 1×1 output runs as mean(), which keeps nothing.
    return Rule(saves_inputs=() if tuple(x.out[1:]) == (1, 1) else (0,), out_elem=x.e0)


def _embedding(x: RuleArgs) -> Rule:
    """An Embedding keeps its token ids (an input tensor); its output has the parameters' dtype."""
    return Rule(saves_inputs=(0,), out_elem=dtype_bytes(x.cfg.precision))


def _rnn_weights(x: RuleArgs, gates: int) -> int:
    f, e = x.f, x.ins[0][-1]
    h, dirs = f["hidden_size"], 2 if f["bidirectional"] else 1
    return sum(dirs * gates * h * ((e if i == 0 else h * dirs) + h) for i in range(f["num_layers"]))


def _lstm(x: RuleArgs) -> Rule:
    r = Rule(saves_output=True, out_elem=x.matmul_elem)
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


def _gru(x: RuleArgs) -> Rule:
    r = Rule(out_elem=x.matmul_elem)
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


def _self_attention(x: RuleArgs) -> Rule:
    r = Rule(out_elem=x.matmul_elem)
    seq, e = x.ins[0]
    r.extras.extend(_attention(x.b, seq, e, x.f["num_heads"], x.f["dropout"], r.out_elem, x.cfg))
    _autocast_copies(x, r, 4 * e * e)
    return r


def _transformer(x: RuleArgs) -> Rule:
    f, b, amp = x.f, x.b, x.cfg.amp
    seq, e = x.ins[0]
    ff, p, heads = f["dim_feedforward"], f["dropout"], f["nhead"]
    # under autocast the linear layers work in 2 B, while the residual stream stays fp32
    lo = x.matmul_elem
    res = 4 if amp else x.e0
    r = Rule(out_elem=res)
    ext = r.extras
    n = b * seq
    ext.extend(_attention(b, seq, e, heads, p, lo, x.cfg))
    mb = 1 if x.cfg.device == "cuda" else lo
    if f["norm_first"]:
        r.saves_inputs = (0,)  # the first LayerNorm reads the block input
        ext.append(("residual sum + FF input", n * e * (res + lo), f"{n}·{e}·({res} + {lo}) B"))
    else:
        ext.append(("2 residual sums + FF input", n * e * (2 * res + lo), f"{n}·{e}·(2·{res} + {lo}) B"))
    ext.append(("LayerNorm mean + rstd ×2", 4 * n * 4, f"4·{commas(n)}·4 B"))
    # GELU keeps its input and the next op keeps its output; with dropout between, that output is freed
    acts = 2 if f["activation"] == "gelu" and p == 0 else 1
    ext.append(("feed-forward hidden", acts * n * ff * lo, f"{acts}·{n}·{ff}·{lo} B"))
    if p > 0:
        ext.append(("dropout masks (attn out, FF, FF out)", (2 * n * e + n * ff) * mb,
                    f"(2·{n}·{e} + {n}·{ff})·{mb} B"))
        ext.append(("FF dropout output", n * ff * lo, f"{n}·{ff}·{lo} B"))
    _autocast_copies(x, r, 4 * e * e + 2 * e * ff)
    return r


# One function per rule a catalogue entry can name (engine.sketch.layer_types.KeepRule); tests/test_catalogue.py checks
# that every kind has its function here and every function is named by some layer type.
LAYER_RULES: dict[KeepRule, Callable[[RuleArgs], Rule]] = {
    "nothing": _keeps_nothing, "source": _source, "merge": _merge, "input": _keeps_input, "output": _keeps_output,
    "softmax": _softmax, "linear": _linear, "conv": _conv, "batchnorm": _batchnorm, "layernorm": _layernorm,
    "rmsnorm": _rmsnorm, "groupnorm": _groupnorm, "dropout": _dropout, "maxpool": _maxpool,
    "adaptive_avg": _adaptive_avg, "embedding": _embedding, "lstm": _lstm, "gru": _gru,
    "attention": _self_attention, "transformer": _transformer,
}
# Layers whose fused kernels the formulas above only approximate (said in the result's notes).
APPROXIMATE: frozenset[KeepRule] = frozenset({"lstm", "gru", "attention", "transformer"})


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
