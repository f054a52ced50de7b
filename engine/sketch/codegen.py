"""Exports a sketch as a readable, standalone PyTorch source file (an nn.Module plus `build(batch_size)`).

The file's submodules carry the node ids as attribute names, so its state_dict matches `Sketch.to_module()`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.atomic_write import replace_atomically
from ..core.errors import UserError
from .catalogue import CATALOGUE

if TYPE_CHECKING:
    from .document import Sketch

# Sources of the catalogue's helper modules, written out only when a sketch uses them. They mirror
# engine.sketch.layer_modules' classes (kept as text so export works where the engine's sources are not shipped).
_HELPERS = {
    "Reshape": '''
class Reshape(nn.Module):
    """Reshapes each sample (the batch dimension is kept)."""

    def __init__(self, *shape):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return x.reshape(x.shape[0], *self.shape)
''',
    "Permute": '''
class Permute(nn.Module):
    """Reorders the dimensions (batch first)."""

    def __init__(self, *dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return x.permute(*self.dims)
''',
    "Mean": '''
class Mean(nn.Module):
    """Averages over one dimension."""

    def __init__(self, dim=1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return x.mean(dim=self.dim)
''',
    "PositionalEmbedding": '''
class PositionalEmbedding(nn.Module):
    """Adds a learned position vector to each step of a (batch, sequence, features) input."""

    def __init__(self, max_len, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, max_len, dim))

    def forward(self, x):
        return x + self.weight[:, : x.shape[1]]
''',
    "TransformerDecoderLayer": '''
class CausalTransformerBlock(nn.TransformerEncoderLayer):
    """A decoder-only (GPT-style) block: causal self-attention, then the feed-forward."""

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device, dtype=x.dtype)
        return super().forward(x, src_mask=mask, is_causal=True)
''',
}
_TAKEN = {"self", "torch", "nn", "x", "_", "build", "model", "batch_size", "mask", "super", "tuple", "print"}


def class_name(sketch_name: str) -> str:
    parts = re.findall(r"[A-Za-z0-9]+", sketch_name or "")
    name = "".join(p[:1].upper() + p[1:] for p in parts) or "SketchModel"
    return name if name[0].isalpha() else "Model" + name


def to_source(sketch: Sketch) -> str:
    """The sketch as Python source: imports, helper classes, `class <Name>(nn.Module)` and `build(batch_size)`."""
    shapes = sketch._checked_shapes()
    order = sketch.topo_order()
    inputs, outputs = sketch.input_ids(), sketch.output_ids()
    srcs = {n: [e.src for e in sketch.inputs_of(n)] for n in order}
    consumers: dict[str, list[str]] = {n: [] for n in order}
    for n in order:
        for s in srcs[n]:
            consumers[s].append(n)
    cls = class_name(sketch.name)
    used_types = {sketch.nodes[n].type for n in order}

    # Walk the same plan as to_module: Output nodes compute nothing; their value is their input's.
    compute = [n for n in order if CATALOGUE[sketch.nodes[n].type].call != "none"]
    value_of: dict[str, str] = {}  # node → the node whose variable holds its value
    for n in order:
        t = sketch.nodes[n].type
        value_of[n] = value_of[srcs[n][0]] if t == "Output" else n
    # A value lives in `x` when its only use is the very next statement (a plain chain); else it gets a name.
    var: dict[str, str] = {}
    result_nodes = {value_of[o] for o in outputs}
    sequence = ([] if len(inputs) != 1 else [inputs[0]]) + compute
    for i, n in enumerate(sequence):
        uses = [c for c in consumers[n] if sketch.nodes[c].type != "Output"]
        nxt = sequence[i + 1] if i + 1 < len(sequence) else None
        if len(uses) == 1 and uses[0] == nxt and srcs[nxt].count(n) == 1 and n not in result_nodes:
            var[n] = "x"
        elif nxt is None and not uses and result_nodes == {n}:
            var[n] = "x"  # the last statement's value, returned
        else:
            var[n] = n if n not in _TAKEN and n != cls else f"{n}_"
    for n in inputs:
        var.setdefault(n, n if n not in _TAKEN else f"{n}_")

    init, body = [], []
    for n in compute:
        node = sketch.nodes[n]
        lt = CATALOGUE[node.type]
        args = [var[value_of[s]] for s in srcs[n]]
        if node.type == "Add":
            body.append(f"{var[n]} = {' + '.join(args)}")
            continue
        if node.type == "Concat":
            body.append(f"{var[n]} = torch.cat([{', '.join(args)}], dim={node.fields['dim']})")
            continue
        init.append(f"self.{n} = {lt.code(node.fields, shapes[n].in_shapes)}")
        if lt.call == "first":
            body.append(f"{var[n]}, _ = self.{n}({args[0]})")
        elif lt.call == "self_attn":
            a = args[0]
            body.append(f"{var[n]}, _ = self.{n}({a}, {a}, {a}, need_weights=False)")
        else:
            body.append(f"{var[n]} = self.{n}({', '.join(args)})")
    rets = [var[value_of[o]] for o in outputs]
    body.append("return " + (rets[0] if len(rets) == 1 else "(" + ", ".join(rets) + ")"))

    examples = []
    for n in inputs:
        f = sketch.nodes[n].fields
        dims = ", ".join(["batch_size", *map(str, f["shape"])])
        if f["dtype"] == "int64":
            examples.append(f"torch.randint(0, {sketch._vocab(n)}, ({dims}{',' if not f['shape'] else ''}))")
        else:
            examples.append(f"torch.randn({dims})")
    example = examples[0] if len(examples) == 1 else "(" + ", ".join(examples) + ")"
    params = sketch.parameter_count()
    helpers = "".join(_HELPERS[t] + "\n" for t in sorted(used_types) if t in _HELPERS)
    ind = " " * 8
    # the sketch's name is user text: keep only harmless characters before it goes into a docstring
    shown = re.sub(r"[^\w \-.,()+]", "", sketch.name)[:80]
    lines = [
        f'"""{cls}: exported by VRAMScope from the sketch \'{shown}\' ({params:,} parameters).',
        "",
        "Use it as `python main.py estimate this_file.py:build`, or import `" + cls + "` and `build`.",
        '"""',
        "",
        "import torch",
        "from torch import nn",
        "",
        helpers.rstrip("\n") + ("\n" if helpers else ""),
        "",
        f"class {cls}(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        *(ind + s for s in init),
        "",
        f"    def forward(self, {', '.join(var[n] for n in inputs)}):",
        *(ind + s for s in body),
        "",
        "",
        "def build(batch_size=1):",
        f'    """Returns ({cls}(), an example input batch)."""',
        f"    return {cls}(), {example}",
        "",
    ]
    text = "\n".join(lines)
    return re.sub(r"\n{4,}", "\n\n\n", text)


def export(sketch: Sketch, path: str | os.PathLike[str]) -> Path:
    """Writes `to_source(sketch)` to `path` atomically."""
    p = Path(path)
    text = to_source(sketch)
    try:
        return replace_atomically(p, text)
    except OSError as e:
        raise UserError(f"cannot write {p}: {e.strerror or e}") from None
