"""What a layer type of the builder's catalogue is (engine.sketch.catalogue holds the entries): its fields and their
kinds, the shapes it is given and infers (never with the batch dimension; `dim` fields use PyTorch's numbering,
batch = dim 0), what autograd keeps of it (KeepRule), and the coercion of a field's value to its kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, SupportsFloat, SupportsIndex

from torch import nn

from ..core.errors import UserError
from ..core.limits import MAX_FIELD

Shape = tuple[int, ...]
Shapes = list[Shape]  # the shapes reaching a layer, one per input port, without the batch dimension
# A field's value: int, float, bool, str (a choice) or tuple[int, ...] ("ints"), by its FieldSpec.kind.
FieldValue = int | float | bool | str | tuple[int, ...]
# A layer's fields by name. The values are typed by each field's kind, which the dict cannot say: the layer
# functions below read them as the kind their own FieldSpecs declare.
Fields = dict[str, Any]

# What autograd keeps of a layer in training: each kind is one function of engine.sketch.keep_rules.LAYER_RULES.
# "nothing" keeps nothing, "input"/"output" keep that tensor, "source" is the model's input; the rest are
# rules of their own. tests/test_catalogue.py fails when a kind has no rule or a rule no layer.
KeepRule = Literal[
    "nothing", "source", "merge", "input", "output", "softmax", "linear", "conv", "batchnorm", "layernorm",
    "rmsnorm", "groupnorm", "dropout", "maxpool", "adaptive_avg", "embedding", "lstm", "gru", "attention",
    "transformer",
]

FieldKind = Literal["int", "float", "bool", "choice", "ints"]
InputDtype = Literal["float", "int64", "any"]  # what a layer accepts; "any" passes its input's dtype through
# How a forward pass calls the module: "plain" m(x), "first" m(x)[0] (LSTM/GRU),
# "self_attn" m(x, x, x, need_weights=False)[0], "merge" m(*xs), "none" (Input/Output: no module).
CallStyle = Literal["plain", "first", "self_attn", "merge", "none"]

InferFn = Callable[[Fields, Shapes], Sequence[int]]
CountFn = Callable[[Fields, Shapes], int]
BuffersFn = Callable[[Fields, Shapes], tuple[int, int]]  # (buffer elements, of which int64 counters)
BuildFn = Callable[[Fields, Shapes], nn.Module]
CodeFn = Callable[[Fields, Shapes], str]
FormulaFn = Callable[[Fields, Shapes], str]  # how the parameter count adds up, e.g. "512·256 + 256"


class ShapeError(UserError):
    """The shapes reaching a layer do not fit it; the message is the human reason."""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: FieldKind
    default: FieldValue
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    help: str = ""


@dataclass(frozen=True)
class LayerType:
    type_name: str
    group: str
    fields: tuple[FieldSpec, ...]
    min_inputs: int
    max_inputs: int | None
    description: str
    _infer: InferFn = field(repr=False, compare=False)
    _params: CountFn = field(repr=False, compare=False)
    _buffers: BuffersFn | None = field(repr=False, compare=False)
    _build: BuildFn | None = field(repr=False, compare=False)  # None: no module (Input, Output)
    _code: CodeFn = field(repr=False, compare=False)
    # What autograd keeps of it in training: the rule engine.sketch.analytic applies (no default: a new layer type
    # says what it keeps, or it cannot be declared).
    keeps: KeepRule = field(kw_only=True)
    # How its parameter count adds up, shown beside the figure (None: the count alone).
    _formula: FormulaFn | None = field(default=None, kw_only=True, repr=False, compare=False)
    input_dtype: InputDtype = "float"
    call: CallStyle = "plain"
    # True when the output is a view of the input (no new memory).
    alias: bool = False

    def spec(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise UserError(f"{self.type_name} has no field '{name}'; it has: {', '.join(self.field_names)}")

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def defaults(self) -> Fields:
        return {f.name: f.default for f in self.fields}

    def _full(self, fields: Fields | None) -> Fields:
        return {**self.defaults(), **(fields or {})}

    def _check_arity(self, in_shapes: Shapes) -> None:
        n = len(in_shapes)
        if n < self.min_inputs:
            need = "an input" if self.min_inputs == 1 else f"at least {self.min_inputs} inputs"
            raise ShapeError(f"{self.type_name} needs {need}, has {n}")
        if self.max_inputs is not None and n > self.max_inputs:
            raise ShapeError(f"{self.type_name} takes at most {self.max_inputs} input(s), has {n}")

    def infer_shape(self, fields: Fields, in_shapes: Sequence[Sequence[int]]) -> Shape:
        shapes = [tuple(int(d) for d in s) for s in in_shapes]
        self._check_arity(shapes)
        out = tuple(int(d) for d in self._infer(self._full(fields), shapes))
        if any(d <= 0 for d in out):
            raise ShapeError(f"output shape {fmt_shape(out)} has an empty dimension")
        return out

    def param_count(self, fields: Fields, in_shapes: Sequence[Sequence[int]]) -> int:
        return int(self._params(self._full(fields), [tuple(s) for s in in_shapes]))

    def param_formula(self, fields: Fields, in_shapes: Sequence[Sequence[int]]) -> str:
        """How param_count adds up, e.g. "3·64 + 64" for Linear(3, 64); '' for a layer without a formula."""
        return self._formula(self._full(fields), [tuple(s) for s in in_shapes]) if self._formula else ""

    def buffer_count(self, fields: Fields, in_shapes: Sequence[Sequence[int]]) -> int:
        """Elements of buffers (e.g. BatchNorm running stats and its int64 step counter)."""
        return int(self._buffers(self._full(fields), [tuple(s) for s in in_shapes])[0]) if self._buffers else 0

    def buffer_bytes(self, fields: Fields, in_shapes: Sequence[Sequence[int]], param_bytes: int = 4) -> int:
        """Bytes of buffers: float buffers at `param_bytes` each, plus int64 counters at 8 B."""
        if not self._buffers:
            return 0
        floats, int64s = self._buffers(self._full(fields), [tuple(s) for s in in_shapes])
        return int(floats - int64s) * param_bytes + int(int64s) * 8

    def build(self, fields: Fields, in_shapes: Sequence[Sequence[int]]) -> nn.Module:
        shapes = [tuple(s) for s in in_shapes]
        self.infer_shape(fields, shapes)
        if self._build is None:
            raise UserError(f"{self.type_name} has no module to build")
        return self._build(self._full(fields), shapes)

    def code(self, fields: Fields, in_shapes: Sequence[Sequence[int]]) -> str:
        return self._code(self._full(fields), [tuple(s) for s in in_shapes])


def fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def conv_out_len(n: int, k: int, s: int = 1, p: int = 0, d: int = 1) -> int:
    """floor((n + 2p − d·(k−1) − 1) / s) + 1 — PyTorch's convolution and pooling output length."""
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def conv_transpose_out_len(n: int, k: int, s: int = 1, p: int = 0, d: int = 1, op: int = 0) -> int:
    return (n - 1) * s - 2 * p + d * (k - 1) + op + 1


def _num(x: int | float, spec: FieldSpec) -> None:
    if isinstance(x, int) and abs(x) > MAX_FIELD:  # past torch's sizes long before past the bounds below
        raise ValueError(f"is too large (at most {MAX_FIELD:,})")
    if spec.min is not None and x < spec.min:
        raise ValueError(f"must be ≥ {spec.min:g}")
    if spec.max is not None and x > spec.max:
        raise ValueError(f"must be ≤ {spec.max:g}")


def _as_int(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("must be a whole number, not true/false")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    text = repr(value)
    raise ValueError(f"must be a whole number, got {text if len(text) <= 40 else text[:37] + '...'}")


def coerce_field(spec: FieldSpec, value: object) -> FieldValue:
    """Coerce `value` to the field's kind; ValueError with the reason (without the field name)."""
    if spec.kind == "int":
        i = _as_int(value)
        _num(i, spec)
        return i
    if spec.kind == "float":
        if isinstance(value, bool):
            raise ValueError("must be a number")
        try:
            if isinstance(value, str):
                v = float(value.strip())
            elif isinstance(value, (SupportsFloat, SupportsIndex)):
                v = float(value)
            else:
                raise TypeError(type(value).__name__)
        except OverflowError:
            raise ValueError("must be a finite number") from None
        except (TypeError, ValueError):
            text = repr(value)
            raise ValueError(f"must be a number, got {text if len(text) <= 40 else text[:37] + '...'}") from None
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        _num(v, spec)
        return v
    if spec.kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.strip().lower() in ("true", "yes", "1")
        raise ValueError(f"must be true or false, got {value!r}")
    if spec.kind == "choice":
        if isinstance(value, str) and value in spec.choices:
            return value
        raise ValueError(f"must be one of {', '.join(map(str, spec.choices))}, got {value!r}")
    if spec.kind == "ints":
        items: list[object]
        if isinstance(value, str):
            items = [p for p in value.replace("(", "").replace(")", "").replace("×", ",").replace("x", ",")
                     .replace(" ", ",").split(",") if p]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            items = [value]
        if not items:
            raise ValueError("needs at least one whole number")
        out = tuple(_as_int(i) for i in items)
        for i in out:
            _num(i, spec)
        return out
    raise AssertionError(spec.kind)
