"""Every builder edit as a QUndoCommand: add, remove, move, set field, connect, disconnect, insert on edge,
paste and auto-layout. Commands change the document's engine Sketch; they never compute anything.

A command runs once through `SketchDocument.push`, which may refuse it with the engine's UserError before
it reaches the undo stack; after that, redo/undo replay it. Simple edits have exact inverses; edits that
touch many nodes and edges at once keep a copy of the sketch before and after (cheap: sketches are small).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Protocol

from PySide6.QtGui import QUndoCommand

from engine.core.errors import UserError
from engine.sketch.document import Edge, Node, Sketch

MOVE_ID = 1001
EdgeKey = tuple[str, str, int]  # (src, dst, port): a connection by value, valid across sketch copies


class SketchHolder(Protocol):
    """What a command edits: a document's sketch (document.SketchDocument is one; it imports this module)."""

    @property
    def sketch(self) -> Sketch: ...


def sketch_nodes(sketch: Sketch) -> dict[str, Node]:
    """id -> Node."""
    return sketch.nodes


def sketch_edges(sketch: Sketch) -> list[Edge]:
    return list(sketch.edges)


def edge_key(edge: Edge) -> EdgeKey:
    return (edge.src, edge.dst, edge.port)


def find_edge(sketch: Sketch, key: EdgeKey) -> Edge | None:
    for e in sketch_edges(sketch):
        if edge_key(e) == tuple(key):
            return e
    # A port may have been renumbered; fall back to src/dst.
    for e in sketch_edges(sketch):
        if (e.src, e.dst) == tuple(key[:2]):
            return e
    return None


class SketchCommand(QUndoCommand):
    """Base: `do()` performs the edit (may raise UserError the first time), `undo_edit()` reverts it."""

    def __init__(self, doc: SketchHolder, text: str):
        super().__init__(text)
        self.doc = doc
        self._skip_next_redo = False

    # The document calls this once, before pushing, so a refused edit never reaches the stack.
    def first_run(self) -> None:
        self.do()
        self._skip_next_redo = True

    def redo(self) -> None:  # noqa: D401 - Qt override
        if self._skip_next_redo:
            self._skip_next_redo = False
            return
        self.do()

    def undo(self) -> None:
        self.undo_edit()

    def do(self) -> None:
        raise NotImplementedError

    def undo_edit(self) -> None:
        raise NotImplementedError

    @property
    def sketch(self) -> Sketch:
        return self.doc.sketch


class SnapshotCommand(SketchCommand):
    """An edit of many parts at once: runs `edit(sketch)` the first time, then swaps whole copies."""

    def __init__(self, doc: SketchHolder, text: str):
        super().__init__(doc, text)
        self._before: Sketch | None = None
        self._after: Sketch | None = None

    def edit(self, sketch: Sketch) -> None:
        raise NotImplementedError

    def do(self) -> None:
        if self._after is None:
            self._before = self.sketch.copy()
            try:
                self.edit(self.sketch)
            except Exception:
                restore_into(self.sketch, self._before)
                raise
            self._after = self.sketch.copy()
        else:
            restore_into(self.sketch, self._after)

    def undo_edit(self) -> None:
        assert self._before is not None, "undo runs only after do() kept the sketch before the edit"
        restore_into(self.sketch, self._before)


def restore_into(target: Sketch, source: Sketch) -> None:
    """Make `target` equal to `source`, keeping `target` the same object (others hold it)."""
    fresh = source.copy()
    target.nodes = fresh.nodes
    target.edges = fresh.edges
    if target.name != fresh.name:
        target.name = fresh.name


class AddNodeCommand(SketchCommand):
    def __init__(self, doc: SketchHolder, type_name: str, x: float, y: float, fields: dict[str, Any] | None = None,
                 node_id: str | None = None):
        super().__init__(doc, f"Add {type_name}")
        self.type_name = type_name
        self.x, self.y = x, y
        self.fields = dict(fields) if fields else None
        self.node_id = node_id

    def do(self) -> None:
        node = self.sketch.add_node(self.type_name, fields=self.fields, x=self.x, y=self.y, id=self.node_id)
        self.node_id = node.id

    def undo_edit(self) -> None:
        assert self.node_id is not None, "undo runs only after do() named the node it added"
        self.sketch.remove_node(self.node_id)


class AddAndConnectCommand(SnapshotCommand):
    """Append a layer below `src` and connect src -> new (drop below the last layer)."""

    def __init__(self, doc: SketchHolder, type_name: str, x: float, y: float, src: str):
        super().__init__(doc, f"Append {type_name}")
        self.type_name, self.x, self.y, self.src = type_name, x, y, src
        self.node_id: str | None = None

    def edit(self, sketch: Sketch) -> None:
        node = sketch.add_node(self.type_name, x=self.x, y=self.y)
        self.node_id = node.id
        sketch.connect(self.src, node.id)


class RemoveCommand(SnapshotCommand):
    """Delete nodes (with their connections) and connections, as one undo step."""

    def __init__(self, doc: SketchHolder, node_ids: list[str], edge_keys: list[EdgeKey]):
        n, e = len(node_ids), len(edge_keys)
        what = []
        if n:
            what.append(f"{n} layer" + ("s" if n > 1 else ""))
        if e:
            what.append(f"{e} connection" + ("s" if e > 1 else ""))
        super().__init__(doc, "Delete " + " and ".join(what))
        self.node_ids = list(node_ids)
        self.edge_keys = list(edge_keys)

    def edit(self, sketch: Sketch) -> None:
        gone = set(self.node_ids)
        for key in self.edge_keys:
            if key[0] in gone or key[1] in gone:
                continue  # leaves with its node
            e = find_edge(sketch, key)
            if e is not None:
                sketch.disconnect(e)
        for nid in self.node_ids:
            if nid in sketch_nodes(sketch):
                sketch.remove_node(nid)


class MoveNodesCommand(SketchCommand):
    """Move one or more nodes. Consecutive moves of the same drag (same `drag_id`) merge into one step."""

    def __init__(self, doc: SketchHolder, moves: dict[str, tuple[tuple[float, float], tuple[float, float]]],
                 drag_id: object = None, text: str | None = None):
        super().__init__(doc, text or ("Move layer" if len(moves) == 1 else f"Move {len(moves)} layers"))
        self.moves = dict(moves)  # id -> (old (x, y), new (x, y))
        self.drag_id = drag_id

    def id(self) -> int:  # noqa: A003 - Qt override
        return MOVE_ID if self.drag_id is not None else -1

    def mergeWith(self, other: QUndoCommand) -> bool:  # noqa: N802 - Qt override
        if not isinstance(other, MoveNodesCommand) or other.drag_id != self.drag_id:
            return False
        for nid, (old, new) in other.moves.items():
            first = self.moves.get(nid, (old, new))[0]
            self.moves[nid] = (first, new)
        return True

    def do(self) -> None:
        nodes = sketch_nodes(self.sketch)
        for nid, (_, (x, y)) in self.moves.items():
            if nid in nodes:
                self.sketch.move_node(nid, x, y)

    def undo_edit(self) -> None:
        nodes = sketch_nodes(self.sketch)
        for nid, ((x, y), _) in self.moves.items():
            if nid in nodes:
                self.sketch.move_node(nid, x, y)


class AutoLayoutCommand(MoveNodesCommand):
    def __init__(self, doc: SketchHolder, moves: dict[str, tuple[tuple[float, float], tuple[float, float]]]):
        super().__init__(doc, moves, drag_id=None, text="Auto layout")


class SetFieldCommand(SketchCommand):
    def __init__(self, doc: SketchHolder, node_id: str, name: str, value: Any):
        super().__init__(doc, f"Set {name}")
        self.node_id, self.name, self.value = node_id, name, value
        self.old = sketch_nodes(doc.sketch)[node_id].fields.get(name)

    def do(self) -> None:
        self.sketch.set_field(self.node_id, self.name, self.value)

    def undo_edit(self) -> None:
        self.sketch.set_field(self.node_id, self.name, self.old)


class ConnectCommand(SketchCommand):
    def __init__(self, doc: SketchHolder, src: str, dst: str, port: int | None = None):
        super().__init__(doc, "Connect")
        self.src, self.dst, self.port = src, dst, port
        self.key: EdgeKey | None = None

    def do(self) -> None:
        edge = self.sketch.connect(self.src, self.dst, self.port)
        self.key = edge_key(edge)
        # Replays must land on the same port the first run got.
        self.port = self.key[2]

    def undo_edit(self) -> None:
        assert self.key is not None, "undo runs only after do() made the connection"
        e = find_edge(self.sketch, self.key)
        if e is not None:
            self.sketch.disconnect(e)


class DisconnectCommand(SketchCommand):
    def __init__(self, doc: SketchHolder, key: EdgeKey):
        super().__init__(doc, "Disconnect")
        self.key = key

    def do(self) -> None:
        e = find_edge(self.sketch, self.key)
        if e is not None:
            self.sketch.disconnect(e)

    def undo_edit(self) -> None:
        self.sketch.connect(self.key[0], self.key[1], self.key[2])


class ReconnectCommand(SnapshotCommand):
    """Drag a connection's end from one input port to another (or off, to disconnect)."""

    def __init__(self, doc: SketchHolder, key: EdgeKey, new_dst: str, new_port: int | None = None):
        super().__init__(doc, "Reconnect")
        self.key, self.new_dst, self.new_port = key, new_dst, new_port

    def edit(self, sketch: Sketch) -> None:
        e = find_edge(sketch, self.key)
        if e is not None:
            sketch.disconnect(e)
        sketch.connect(self.key[0], self.new_dst, self.new_port)


class InsertOnEdgeCommand(SnapshotCommand):
    def __init__(self, doc: SketchHolder, key: EdgeKey, type_name: str, x: float, y: float):
        super().__init__(doc, f"Insert {type_name}")
        self.key, self.type_name, self.x, self.y = key, type_name, x, y
        self.node_id: str | None = None

    def edit(self, sketch: Sketch) -> None:
        e = find_edge(sketch, self.key)
        if e is None:
            raise UserError(f"the connection '{self.key[0]}' → '{self.key[1]}' is no longer there")
        node = sketch.insert_on_edge(e, self.type_name)
        self.node_id = node.id
        sketch.move_node(node.id, self.x, self.y)


class PasteCommand(SnapshotCommand):
    """Add copied nodes with fresh ids and the connections among them."""

    def __init__(self, doc: SketchHolder, payload: dict[str, Any], dx: float, dy: float, text: str = "Paste"):
        super().__init__(doc, text)
        self.payload, self.dx, self.dy = payload, dx, dy
        self.new_ids: list[str] = []

    def edit(self, sketch: Sketch) -> None:
        check_payload(self.payload)
        mapping: dict[str, str] = {}
        for n in self.payload.get("nodes", []):
            node = sketch.add_node(n["type"], fields=n.get("fields") or None,
                                   x=float(n.get("x", 0)) + self.dx, y=float(n.get("y", 0)) + self.dy)
            mapping[n["id"]] = node.id
        # Ports are renumbered in their original order, so a partial copy has no gaps.
        edges = sorted(self.payload.get("edges", []), key=lambda e: (e.get("port") or 0))
        for e in edges:
            if e["src"] in mapping and e["dst"] in mapping:
                sketch.connect(mapping[e["src"]], mapping[e["dst"]])
        self.new_ids = list(mapping.values())


_NOT_NODES = "the clipboard holds no VRAMScope layers"


def _number(v: object) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v)) and abs(v) <= 1e9
    except OverflowError:
        return False


def check_payload(payload: object) -> None:
    """UserError unless `payload` has the clipboard format's shape (whatever another program put there)."""
    if not isinstance(payload, dict):
        raise UserError(_NOT_NODES)
    nodes, edges = payload.get("nodes", []), payload.get("edges", [])
    if not isinstance(nodes, list) or not isinstance(edges, list):
        raise UserError(_NOT_NODES)
    for n in nodes:
        if not (isinstance(n, dict) and isinstance(n.get("id"), str) and isinstance(n.get("type"), str)
                and isinstance(n.get("fields", {}), (dict, type(None)))
                and all(_number(n.get(k, 0)) for k in ("x", "y"))):
            raise UserError(f"{_NOT_NODES} (a layer in it is malformed)")
    for e in edges:
        if not (isinstance(e, dict) and isinstance(e.get("src"), str) and isinstance(e.get("dst"), str)
                and (e.get("port") is None or (isinstance(e.get("port"), int) and not isinstance(e["port"], bool)))):
            raise UserError(f"{_NOT_NODES} (a connection in it is malformed)")


def sketch_payload(sketch: Sketch, ids: Iterable[str]) -> dict[str, Any]:
    """Copied nodes and the connections among them, as plain JSON-able data (the clipboard format)."""
    nodes = sketch_nodes(sketch)
    keep = [i for i in ids if i in nodes]
    chosen = set(keep)
    out_nodes = []
    for i in keep:
        n = nodes[i]
        out_nodes.append({"id": n.id, "type": n.type,
                          "fields": {k: (list(v) if isinstance(v, tuple) else v) for k, v in n.fields.items()},
                          "x": n.x, "y": n.y})
    out_edges = [{"src": e.src, "dst": e.dst, "port": e.port}
                 for e in sketch_edges(sketch) if e.src in chosen and e.dst in chosen]
    return {"format": "vramscope-nodes", "nodes": out_nodes, "edges": out_edges}
