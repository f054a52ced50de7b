"""The builder's document: a DAG of catalogue layers, its shape inference, versioned JSON and `to_module()`.

Sketch files are plain JSON (format "vramscope-sketch"); loading one never executes code.
"""

from __future__ import annotations

import copy as _copy
import difflib
import heapq
import json
import keyword
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config.train_config import TrainConfig
from ..core import bounded_read
from ..core.atomic_write import replace_atomically
from ..core.errors import UserError, printable
from ..core.resources import resource_path
from .catalogue import CATALOGUE, layer_type
from .layer_types import Fields, FieldValue, LayerType, Shape, ShapeError, coerce_field

FORMAT = "vramscope-sketch"
VERSION = 1
_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")  # \Z: `$` also matches before a final newline
# Names a node id may not take: they would shadow nn.Module attributes in to_module() and generated code.
_RESERVED = set(dir(nn.Module)) | set(keyword.kwlist) | set(keyword.softkwlist)


@dataclass
class Node:
    id: str
    type: str
    fields: Fields
    x: float = 0.0
    y: float = 0.0


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    port: int = 0  # the input index at dst (Add/Concat take several)


@dataclass(frozen=True)
class ShapeResult:
    shape: Shape | None  # output shape without the batch dimension; None when it cannot be inferred
    error: str | None  # the reason, or "depends on <id>" downstream of a failing node
    params: int = 0
    dtype: str = "float32"
    in_shapes: tuple[Shape, ...] = ()


_MAX_XY = 1e9  # canvas coordinates: far beyond any drawing, well inside what Qt's scene handles
_MAX_PORT = 1024


def _coordinate(c: object) -> bool:
    if not isinstance(c, (int, float)) or isinstance(c, bool):
        return False
    try:
        return math.isfinite(float(c)) and abs(c) <= _MAX_XY
    except OverflowError:
        return False


def _short(v: object) -> str:
    text = str(v) if not isinstance(v, int) or v.bit_length() < 200 else "a huge number"
    return text if len(text) <= 40 else text[:37] + "..."


MAX_SKETCH_BYTES = 16 << 20  # a sketch of thousands of layers is a few MiB


def parse_json(text: str, where: str) -> Any:
    """JSON text → Python data through the project's one bounded reader: every way it can fail (bad syntax,
    NaN or Infinity, a number too long, nesting too deep) is one line naming `where`."""
    return bounded_read.parse_json(text, where)


def _where(node_id: str, field_name: str | None = None) -> str:
    return f"node '{printable(node_id, 64)}'" + (f" field '{printable(field_name, 64)}'" if field_name else "")


class Sketch:
    """A DAG of layer nodes. Mutators validate and raise UserError; the GUI's undo commands call them."""

    def __init__(self, name: str = "untitled"):
        self._name = str(name) or "untitled"
        self.nodes: dict[str, Node] = {}
        self.edges: list[Edge] = []
        # The training configuration it was saved with (TrainConfig.to_json), so that reopening it restores the
        # batch size, optimizer and precision; None when it was never saved with one.
        self.training: dict[str, Any] | None = None

    # ------------------------------------------------------------ identity
    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = str(value).strip() or "untitled"

    def __repr__(self) -> str:
        return f"Sketch({self._name!r}, {len(self.nodes)} nodes, {len(self.edges)} edges)"

    # ------------------------------------------------------------ mutators
    def _new_id(self, type_name: str) -> str:
        base = re.sub(r"[^a-z0-9_]", "_", type_name.lower())
        n = 1
        while f"{base}_{n}" in self.nodes:
            n += 1
        return f"{base}_{n}"

    def _node(self, node_id: str) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise UserError(f"no node '{node_id}' in the sketch") from None

    def add_node(self, type: str, fields: Mapping[str, object] | None = None, x: float = 0, y: float = 0,
                 id: str | None = None) -> Node:
        lt = layer_type(type)
        if id is None:
            id = self._new_id(type)
        elif not isinstance(id, str) or not _ID.match(id) or id in _RESERVED:
            raise UserError(f"node id {id!r} must be a Python-style name (letters, digits, _), not a reserved word")
        elif id in self.nodes:
            raise UserError(f"a node '{id}' already exists")
        values = lt.defaults()
        for k, v in (fields or {}).items():
            values[k] = self._coerce(id, lt, k, v)
        node = Node(id, type, values, float(x), float(y))
        self.nodes[id] = node
        return node

    @staticmethod
    def _coerce(node_id: str, lt: LayerType, name: str, value: object) -> FieldValue:
        if name not in lt.field_names:
            raise UserError(f"{lt.type_name} has no field '{name}'", where=_where(node_id, name))
        try:
            return coerce_field(lt.spec(name), value)
        except ValueError as e:
            raise UserError(str(e), where=_where(node_id, name)) from None

    def remove_node(self, node_id: str) -> list[Edge]:
        """Removes the node and its edges; returns the removed edges (for undo)."""
        self._node(node_id)
        removed = [e for e in self.edges if node_id in (e.src, e.dst)]
        self.edges = [e for e in self.edges if node_id not in (e.src, e.dst)]
        del self.nodes[node_id]
        return removed

    def set_field(self, node_id: str, name: str, value: object) -> FieldValue:
        node = self._node(node_id)
        v = self._coerce(node_id, layer_type(node.type), name, value)
        node.fields[name] = v
        return v

    def move_node(self, node_id: str, x: float, y: float) -> None:
        node = self._node(node_id)
        node.x, node.y = float(x), float(y)

    def inputs_of(self, node_id: str) -> list[Edge]:
        """Incoming edges ordered by port."""
        return sorted((e for e in self.edges if e.dst == node_id), key=lambda e: e.port)

    def incoming(self) -> dict[str, list[Edge]]:
        """Every node's incoming edges ordered by port, in one pass (for whole-graph walks)."""
        out: dict[str, list[Edge]] = {n: [] for n in self.nodes}
        for e in self.edges:
            out[e.dst].append(e)
        for lst in out.values():
            lst.sort(key=lambda e: e.port)
        return out

    def outputs_of(self, node_id: str) -> list[Edge]:
        return [e for e in self.edges if e.src == node_id]

    def _reaches(self, start: str, goal: str) -> bool:
        """Whether a path leads from `start` to `goal`: one walk over an adjacency built once (O(V + E))."""
        succ: dict[str, list[str]] = {}
        for e in self.edges:
            succ.setdefault(e.src, []).append(e.dst)
        seen, todo = {start}, [start]
        while todo:
            n = todo.pop()
            if n == goal:
                return True
            for d in succ.get(n, ()):
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return False

    def connect(self, src: str, dst: str, port: int | None = None) -> Edge:
        self._node(src), self._node(dst)
        if src == dst or self._reaches(dst, src):
            raise UserError(f"connecting '{src}' → '{dst}' would make a cycle")
        edge = self._edge(src, dst, port, self.inputs_of(dst))
        self.edges.append(edge)
        return edge

    def _edge(self, src: str, dst: str, port: object, incoming: list[Edge]) -> Edge:
        """The edge src → dst at `port` (None: the first free input), checked against dst's `incoming` edges
        (everything but cycles, which the callers check: one edge at a time, or a whole file at once)."""
        s, d = self.nodes[src], self.nodes[dst]
        lt = layer_type(d.type)
        if layer_type(s.type).type_name == "Output":
            raise UserError(f"'{src}' is an Output: nothing can follow it")
        if src == dst:
            raise UserError(f"connecting '{src}' → '{dst}' would make a cycle")
        if lt.max_inputs == 0:
            raise UserError(f"'{dst}' ({d.type}) takes no inputs")
        if lt.max_inputs is not None and len(incoming) >= lt.max_inputs:
            raise UserError(f"'{dst}' ({d.type}) takes {lt.max_inputs} input(s) and is full")
        used = {e.port for e in incoming}
        if port is None:
            port = 0
            while port in used:
                port += 1
        elif not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < _MAX_PORT:
            raise UserError(f"port must be a whole number from 0 to {_MAX_PORT - 1}, got {_short(port)}")
        elif port in used:
            raise UserError(f"input {port} of '{dst}' is already connected")
        return Edge(src, dst, port)

    def disconnect(self, edge: Edge) -> None:
        try:
            self.edges.remove(edge)
        except ValueError:
            raise UserError(f"no connection '{edge.src}' → '{edge.dst}' (input {edge.port})") from None

    def insert_on_edge(self, edge: Edge, type: str, fields: Mapping[str, object] | None = None,
                       id: str | None = None) -> Node:
        """Puts a new node of `type` on the connection: src → new → dst (keeping dst's port)."""
        if edge not in self.edges:
            raise UserError(f"no connection '{edge.src}' → '{edge.dst}' (input {edge.port})")
        lt = layer_type(type)
        if lt.min_inputs == 0 or lt.max_inputs == 0 or lt.type_name == "Output":
            raise UserError(f"a {type} cannot be inserted on a connection")
        s, d = self.nodes[edge.src], self.nodes[edge.dst]
        node = self.add_node(type, fields, (s.x + d.x) / 2, (s.y + d.y) / 2, id=id)
        i = self.edges.index(edge)
        self.edges[i:i + 1] = [Edge(edge.src, node.id, 0), Edge(node.id, edge.dst, edge.port)]
        return node

    def copy(self) -> Sketch:
        other = Sketch(self._name)
        other.nodes = {k: _copy.deepcopy(v) for k, v in self.nodes.items()}
        other.edges = list(self.edges)
        other.training = dict(self.training) if self.training is not None else None
        return other

    # ------------------------------------------------------------ analysis
    def topo_order(self) -> list[str]:
        """Node ids in a dependency order, stable with respect to insertion order."""
        order = self._ordered()
        if len(order) != len(self.nodes):
            raise UserError("the sketch has a cycle")
        return order

    def _ordered(self) -> list[str]:
        """Kahn's order of the nodes, stable with respect to insertion order; a node on a cycle, or after one, is
        left out."""
        indeg = {n: 0 for n in self.nodes}
        succ: dict[str, list[str]] = {n: [] for n in self.nodes}
        for e in self.edges:
            indeg[e.dst] += 1
            succ[e.src].append(e.dst)
        pos = {n: i for i, n in enumerate(self.nodes)}
        ready = [pos[n] for n in self.nodes if indeg[n] == 0]
        heapq.heapify(ready)
        names = list(self.nodes)
        order: list[str] = []
        while ready:
            n = names[heapq.heappop(ready)]
            order.append(n)
            for d in succ[n]:
                indeg[d] -= 1
                if indeg[d] == 0:
                    heapq.heappush(ready, pos[d])
        return order

    def infer_shapes(self, batch_size: int = 1) -> dict[str, ShapeResult]:
        """Every node's output shape (without batch), or the reason it has none; the rest still resolve."""
        out: dict[str, ShapeResult] = {}
        incoming = self.incoming()
        for nid in self.topo_order():
            node = self.nodes[nid]
            lt = CATALOGUE[node.type]
            ins = [out[e.src] for e in incoming[nid]]
            bad = next((e.src for e, r in zip(incoming[nid], ins, strict=False) if r.shape is None), None)
            if bad is not None:
                root = out[bad].error or ""
                root = root[len("depends on "):] if root.startswith("depends on ") else bad
                out[nid] = ShapeResult(None, f"depends on {root}")
                continue
            in_shapes = tuple(r.shape for r in ins if r.shape is not None)  # all of them: none is missing
            try:
                dtype = self._dtype(lt, node, ins)
                shape = lt.infer_shape(node.fields, in_shapes)
                params = lt.param_count(node.fields, in_shapes)
            except ShapeError as e:
                out[nid] = ShapeResult(None, str(e), 0, "float32", in_shapes)
                continue
            out[nid] = ShapeResult(shape, None, params, dtype, in_shapes)
        return out

    @staticmethod
    def _dtype(lt: LayerType, node: Node, ins: Sequence[ShapeResult]) -> str:
        if lt.type_name == "Input":
            dtype: str = node.fields["dtype"]
            return dtype
        in_dtypes = {r.dtype for r in ins}
        if lt.input_dtype == "float" and "int64" in in_dtypes:
            raise ShapeError(f"{lt.type_name} needs float input; token ids (int64) go into an Embedding first")
        if lt.input_dtype == "int64" and in_dtypes != {"int64"}:
            raise ShapeError(f"{lt.type_name} needs int64 token ids (set the Input's dtype to int64)")
        if lt.input_dtype == "any" and ins:
            return ins[0].dtype
        return "float32"

    def errors(self) -> dict[str, str]:
        return {k: r.error for k, r in self.infer_shapes().items() if r.error}

    def parameter_count(self) -> int:
        return sum(r.params for r in self.infer_shapes().values())

    def input_ids(self) -> list[str]:
        return [n for n in self.topo_order() if self.nodes[n].type == "Input"]

    def output_ids(self) -> list[str]:
        """The Output nodes, or (without any) the non-Input nodes nothing consumes."""
        order = self.topo_order()
        outs = [n for n in order if self.nodes[n].type == "Output"]
        if outs:
            return outs
        used = {e.src for e in self.edges}
        return [n for n in order if n not in used and self.nodes[n].type != "Input"]

    def _checked_shapes(self) -> dict[str, ShapeResult]:
        if not self.input_ids():
            raise UserError(f"sketch '{self._name}' has no Input node; add one and set its shape")
        shapes = self.infer_shapes()
        for nid, r in shapes.items():
            if r.error and not r.error.startswith("depends on "):
                raise UserError(r.error, where=f"{_where(nid)} ({self.nodes[nid].type})")
        if not self.output_ids():
            raise UserError(f"sketch '{self._name}' has no output; connect an Output node")
        return shapes

    # ------------------------------------------------------------ torch
    def to_module(self) -> nn.Module:
        """An nn.Module whose submodules are named by node id, so per-module figures map back to nodes."""
        shapes = self._checked_shapes()
        modules: dict[str, nn.Module] = {}
        plan: list[tuple[str, str, tuple[str, ...]]] = []
        incoming = self.incoming()
        for nid in self.topo_order():
            node = self.nodes[nid]
            lt = CATALOGUE[node.type]
            srcs = tuple(e.src for e in incoming[nid])
            if lt.call != "none":
                modules[nid] = lt.build(node.fields, shapes[nid].in_shapes)
            plan.append((nid, lt.call, srcs))
        return SketchModule(self._name, modules, plan, self.input_ids(), self.output_ids(),
                            checkpoint_node_ids(self))

    def example_inputs(self, batch_size: int = 1) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Random inputs (randn, or randint ids below the smallest vocabulary fed); tuple for several Inputs."""
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise UserError(f"batch size must be a positive whole number, got {batch_size}")
        xs: list[torch.Tensor] = []
        for nid in self.input_ids():
            f = self.nodes[nid].fields
            shape = (batch_size, *f["shape"])
            if f["dtype"] == "int64":
                xs.append(torch.randint(0, self._vocab(nid), shape, dtype=torch.int64))
            else:
                xs.append(torch.randn(shape))
        if not xs:
            raise UserError(f"sketch '{self._name}' has no Input node")
        return xs[0] if len(xs) == 1 else tuple(xs)

    def _vocab(self, nid: str) -> int:
        vocab: int | None = None
        todo, seen = [nid], set()
        succ: dict[str, list[Edge]] = {}
        for e in self.edges:
            succ.setdefault(e.src, []).append(e)
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            for e in succ.get(n, ()):
                d = self.nodes[e.dst]
                if d.type == "Embedding":
                    v = d.fields["num_embeddings"]
                    vocab = v if vocab is None else min(vocab, v)
                elif CATALOGUE[d.type].input_dtype == "any":
                    todo.append(d.id)
        return vocab or 2

    # ------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        def plain(v: object) -> object:
            return list(v) if isinstance(v, tuple) else v

        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self._name,
            "nodes": [
                {"id": n.id, "type": n.type, "fields": {k: plain(v) for k, v in n.fields.items()},
                 "x": n.x, "y": n.y}
                for n in self.nodes.values()
            ],
            "edges": [{"src": e.src, "dst": e.dst, "port": e.port} for e in self.edges],
            **({"training": dict(self.training)} if self.training is not None else {}),
        }

    def to_json_text(self) -> str:
        """The JSON file's text: one node or edge per line, so files read (and diff) well."""
        d = self.to_json()

        def rows(items: Iterable[object]) -> str:
            return ",\n".join("  " + json.dumps(i, ensure_ascii=False) for i in items)

        head = ", ".join(f"{json.dumps(k)}: {json.dumps(d[k], ensure_ascii=False)}"
                         for k in ("format", "version", "name"))
        training = (",\n \"training\": " + json.dumps(d["training"], ensure_ascii=False)) if "training" in d else ""
        return ("{\n " + head + ",\n \"nodes\": [\n" + rows(d["nodes"]) + "\n ],\n \"edges\": [\n"
                + rows(d["edges"]) + "\n ]" + training + "\n}\n")

    @classmethod
    def from_json(cls, d: object) -> Sketch:
        if not isinstance(d, dict):
            raise UserError("not a VRAMScope sketch (expected a JSON object)")
        if d.get("format") != FORMAT:
            raise UserError(f"not a VRAMScope sketch (\"format\" should be \"{FORMAT}\")")
        v = d.get("version")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError("sketch \"version\" must be a whole number ≥ 1")
        if v > VERSION:
            raise UserError(f"sketch version {v} was written by a newer VRAMScope (this one reads up to {VERSION})")
        nodes, edges = d.get("nodes"), d.get("edges", [])
        if not isinstance(nodes, list):
            raise UserError("sketch \"nodes\" must be a list")
        if not isinstance(edges, list):
            raise UserError("sketch \"edges\" must be a list")
        name = d.get("name", "untitled")
        sk = cls(name if isinstance(name, str) else "untitled")
        training = d.get("training")
        if training is not None:
            if not isinstance(training, dict):
                raise UserError("sketch \"training\" must be an object (a training configuration)")
            try:
                sk.training = TrainConfig.from_json(training).to_json()
            except (UserError, TypeError, ValueError) as e:
                raise UserError(f"sketch \"training\": {e}") from None
        for i, nd in enumerate(nodes):
            if not isinstance(nd, dict) or not isinstance(nd.get("id"), str) or not isinstance(nd.get("type"), str):
                raise UserError(f"sketch node #{i + 1} needs a string \"id\" and \"type\"")
            nid = nd["id"]
            if nd["type"] not in CATALOGUE:
                try:
                    layer_type(nd["type"])
                except UserError as e:
                    raise UserError(str(e), where=_where(nid)) from None
            fields = nd.get("fields", {})
            if not isinstance(fields, dict):
                raise UserError("\"fields\" must be an object", where=_where(nid))
            x, y = nd.get("x", 0), nd.get("y", 0)
            if not all(_coordinate(c) for c in (x, y)):
                raise UserError(f"\"x\" and \"y\" must be finite numbers within ±{_MAX_XY:g}", where=_where(nid))
            try:
                sk.add_node(nd["type"], fields, x, y, id=nid)
            except UserError as e:
                msg = str(e)
                raise UserError(msg if msg.startswith("node '") else f"{_where(nid)}: {msg}") from None
        # All edges are checked with one map of each node's inputs and one cycle search at the end: linear in
        # the file's size whatever order its edges come in (connect() per edge walks the graph each time).
        incoming: dict[str, list[Edge]] = {n: [] for n in sk.nodes}
        index: dict[Edge, int] = {}
        for i, ed in enumerate(edges):
            if not isinstance(ed, dict) or not isinstance(ed.get("src"), str) or not isinstance(ed.get("dst"), str):
                raise UserError(f"sketch edge #{i + 1} needs string \"src\" and \"dst\"")
            for end in ("src", "dst"):
                if ed[end] not in sk.nodes:
                    raise UserError(f"sketch edge #{i + 1}: no node '{_short(ed[end])}'")
            try:
                edge = sk._edge(ed["src"], ed["dst"], ed.get("port", None), incoming[ed["dst"]])
            except UserError as e:
                reason = str(e)
                if sk._reaches(ed["dst"], ed["src"]):  # the edge's first fault, as connect() names it
                    reason = f"connecting '{ed['src']}' → '{ed['dst']}' would make a cycle"
                raise UserError(f"sketch edge #{i + 1} ('{ed['src']}' → '{ed['dst']}'): {reason}") from None
            incoming[edge.dst].append(edge)
            index.setdefault(edge, i)
            sk.edges.append(edge)
        cycle = sk._a_cycle()
        if cycle:
            last = max(cycle, key=lambda e: index[e])
            raise UserError(f"sketch edge #{index[last] + 1} ('{last.src}' → '{last.dst}'): connecting "
                            f"'{last.src}' → '{last.dst}' would make a cycle")
        return sk

    def _a_cycle(self) -> list[Edge]:
        """The edges of one cycle, or [] for a DAG (Kahn's order, then a walk inside what it could not order)."""
        ordered = set(self._ordered())
        left = {n for n in self.nodes if n not in ordered}
        if not left:
            return []
        # Every node left has a predecessor left: walking back from any of them must revisit a node.
        back = {e.dst: e for e in self.edges if e.src in left and e.dst in left}
        n = next(iter(left))
        path: list[Edge] = []
        seen: dict[str, int] = {}
        while n not in seen:
            seen[n] = len(path)
            path.append(back[n])
            n = back[n].src
        return path[seen[n]:]

    @classmethod
    def load(cls, path: str | Path) -> Sketch:
        p = Path(path)
        # a regular file only (a pipe or /dev/zero would block or fill memory), of a sketch's size at most
        text = bounded_read.read_text(p, max_bytes=MAX_SKETCH_BYTES, what="sketch file")
        data = parse_json(text, str(p))
        try:
            return cls.from_json(data)
        except UserError as e:
            raise UserError(f"{p}: {e}") from None
        except RecursionError:
            raise UserError(f"{p}: nested too deeply to be a sketch") from None

    def save(self, path: str | Path) -> Path:
        """Atomic: writes a temp file beside the target, then renames it over."""
        p = Path(path)
        text = self.to_json_text()
        try:
            return replace_atomically(p, text)
        except OSError as e:
            raise UserError(f"cannot write sketch to {p}: {e.strerror or e}") from None


class SketchModule(nn.Module):
    """A sketch as a module: one submodule per node (named by node id), forward walks the topological order."""

    def __init__(self, name: str, modules: Mapping[str, nn.Module], plan: Sequence[tuple[str, str, Sequence[str]]],
                 input_ids: Sequence[str], output_ids: Sequence[str], checkpoint_ids: Sequence[str] = ()) -> None:
        super().__init__()
        self.sketch_name = name
        self._checkpoint_ids = tuple(checkpoint_ids)
        for nid, m in modules.items():
            self.add_module(nid, m)
        self._plan = [(nid, call, tuple(srcs)) for nid, call, srcs in plan]
        self._input_ids = tuple(input_ids)
        self._output_ids = tuple(output_ids)
        # Drop each intermediate as soon as its last consumer ran, as nn.Sequential does: holding them all
        # would keep every activation alive to the end of forward and inflate the peak.
        last: dict[str, int] = {}
        for i, (_, _, srcs) in enumerate(self._plan):
            for src in srcs:
                last[src] = i
        self._release = [tuple(s for s in dict.fromkeys(srcs) if last.get(s) == i and s not in self._output_ids)
                         for i, (_, _, srcs) in enumerate(self._plan)]

    def checkpoint_blocks(self) -> list[tuple[str, nn.Module]]:
        """(name, module) of the repeated composite blocks activation checkpointing should wrap; a sketch is
        not a ModuleList of blocks, so it says which of its nodes are (the analytic estimate assumes these)."""
        return [(n, self.get_submodule(n)) for n in self._checkpoint_ids]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if len(inputs) != len(self._input_ids):
            raise TypeError(f"{self.sketch_name} takes {len(self._input_ids)} input(s), got {len(inputs)}")
        env = dict(zip(self._input_ids, inputs, strict=False))
        for (nid, call, srcs), release in zip(self._plan, self._release, strict=False):
            xs = [env[s] for s in srcs]
            for s in release:
                del env[s]
            if call == "none":
                if srcs:
                    env[nid] = xs[0]
                continue
            m = self.get_submodule(nid)  # looked up each time: peft may have replaced the node's module
            if call == "plain":
                env[nid] = m(xs[0])
            elif call == "first":
                env[nid] = m(xs[0])[0]
            elif call == "self_attn":
                env[nid] = m(xs[0], xs[0], xs[0], need_weights=False)[0]
            else:
                env[nid] = m(*xs)
        outs = tuple(env[o] for o in self._output_ids)
        return outs[0] if len(outs) == 1 else outs


# Composite layers worth recomputing: checkpointing one keeps only its input instead of its internals.
CHECKPOINT_TYPES = ("TransformerEncoderLayer", "TransformerDecoderLayer", "MultiheadAttention", "LSTM", "GRU")


def checkpoint_node_ids(sketch: Sketch) -> list[str]:
    """Nodes that activation checkpointing wraps: composite layers whose type repeats (≥ 2 in the sketch)."""
    ok = {n for n, r in sketch.infer_shapes().items() if r.shape is not None}
    counts: dict[str, int] = {}
    for n in ok:
        counts[sketch.nodes[n].type] = counts.get(sketch.nodes[n].type, 0) + 1
    return [n for n in sketch.topo_order() if n in ok and sketch.nodes[n].type in CHECKPOINT_TYPES
            and counts[sketch.nodes[n].type] >= 2]


# ---------------------------------------------------------------- templates

def templates_dir() -> Path:
    return resource_path("templates")


def list_templates() -> list[tuple[str, Path]]:
    d = templates_dir()
    return sorted((p.stem, p) for p in d.glob("*.json")) if d.is_dir() else []


def load_template(name: str) -> Sketch:
    found = dict(list_templates())
    if name not in found:
        close = difflib.get_close_matches(name, list(found), n=3)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        raise UserError(f"unknown sketch template '{name}'{hint}; there are: {', '.join(found)}")
    return Sketch.load(found[name])
