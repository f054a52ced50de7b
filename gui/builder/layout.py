"""Automatic layered layout of a sketch's DAG: top-to-bottom layers, few crossings, straight chains.

Pure Python (no Qt) so it is testable on its own; the canvas turns its result into one undoable move.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

NODE_W = 216.0
NODE_H = 96.0
H_GAP = 48.0
V_GAP = 56.0


def _layers(ids: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Longest-path layering: a node sits one layer below its deepest predecessor."""
    preds: dict[str, list[str]] = {i: [] for i in ids}
    succs: dict[str, list[str]] = {i: [] for i in ids}
    for s, d in edges:
        if s in preds and d in preds:
            preds[d].append(s)
            succs[s].append(d)
    indeg = {i: len(preds[i]) for i in ids}
    ready = [i for i in ids if indeg[i] == 0]
    layer = {i: 0 for i in ids}
    seen = 0
    while ready:
        n = ready.pop(0)
        seen += 1
        for d in succs[n]:
            layer[d] = max(layer[d], layer[n] + 1)
            indeg[d] -= 1
            if indeg[d] == 0:
                ready.append(d)
    # A cycle cannot come from the engine (connect refuses it); keep such nodes at layer 0 rather than fail.
    return layer


def layered_layout(
    ids: Iterable[str],
    edges: Iterable[tuple[str, str]],
    *,
    node_w: float = NODE_W,
    node_h: float = NODE_H,
    h_gap: float = H_GAP,
    v_gap: float = V_GAP,
    origin: tuple[float, float] = (0.0, 0.0),
    heights: dict[str, float] | None = None,
) -> dict[str, tuple[float, float]]:
    """Top-left position of every node. `ids` order (topological is best) breaks ties.

    Layers go down the page; inside a layer nodes are ordered by the barycentre of their neighbours
    (a few down and up sweeps) and placed under their parents where there is room.
    """
    ids = list(dict.fromkeys(ids))
    edges = [(s, d) for s, d in edges if s != d]
    if not ids:
        return {}
    layer = _layers(ids, edges)
    depth = max(layer.values()) + 1
    rows: list[list[str]] = [[] for _ in range(depth)]
    for i in ids:
        rows[layer[i]].append(i)
    preds: dict[str, list[str]] = {i: [] for i in ids}
    succs: dict[str, list[str]] = {i: [] for i in ids}
    for s, d in edges:
        if s in preds and d in preds:
            preds[d].append(s)
            succs[s].append(d)

    def sweep(order_rows: list[list[str]], neighbours: dict[str, list[str]], rng: range) -> None:
        for r in rng:
            pos = {}
            for other in order_rows:
                for k, n in enumerate(other):
                    pos[n] = k
            row = order_rows[r]
            keyed = []
            for k, n in enumerate(row):
                ns = [pos[m] for m in neighbours[n] if m in pos]
                keyed.append((sum(ns) / len(ns) if ns else float(k), k, n))
            keyed.sort()
            order_rows[r] = [n for _, _, n in keyed]

    for _ in range(3):
        sweep(rows, preds, range(1, depth))
        sweep(rows, succs, range(depth - 2, -1, -1))

    # Longest path from each node to a sink, for choosing each row's anchor.
    below = {i: 0 for i in ids}
    for r in range(depth - 1, -1, -1):
        for n in rows[r]:
            below[n] = max((below[d] + 1 for d in succs[n]), default=0)

    step = node_w + h_gap
    x: dict[str, float] = {}
    for r, row in enumerate(rows):
        if r == 0:
            start = -(len(row) - 1) * step / 2
            for k, n in enumerate(row):
                x[n] = start + k * step
            continue
        # Wanted: under the parents; then pushed apart left to right, then re-centred on the wish.
        want = []
        for n in row:
            ps = [p for p in preds[n] if p in x]
            if ps:
                # A merge (residual Add, Concat) lines up with its deepest input: the main path stays
                # straight and the shorter branch (the skip or downsample) sits beside it.
                deepest = max(layer[p] for p in ps)
                ps = [p for p in ps if layer[p] == deepest]
                want.append(sum(x[p] for p in ps) / len(ps))
            else:
                want.append(want[-1] + step if want else 0.0)
        placed: list[float] = []
        for w in want:
            placed.append(max(w, placed[-1] + step) if placed else w)
        # The row's anchor — the node with the longest way still to go (the main path) — keeps its wish, so
        # the main path is one straight column and branches spread beside it.
        anchor = max(range(len(row)), key=lambda k: (below[row[k]], -k))
        shift = want[anchor] - placed[anchor]
        for n, p in zip(row, placed, strict=False):
            x[n] = p + shift

    # Row heights may differ (taller nodes with errors); stack rows by the tallest node in each.
    ox, oy = origin
    min_x = min(x.values())
    out: dict[str, tuple[float, float]] = {}
    y = oy
    for row in rows:
        tallest = max((heights or {}).get(n, node_h) for n in row) if row else node_h
        for n in row:
            out[n] = (ox + x[n] - min_x, y)
        y += tallest + v_gap
    return out
