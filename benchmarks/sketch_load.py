"""Loading large sketches: seconds to read a chain of N nodes whose edges are listed in order and backwards.

    python -m benchmarks.sketch_load [N ...]      (default 2000 10000)

Loading must stay linear in the file's size whatever the edges' order (issue 12: 2,000 reversed nodes took 62 s).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from engine.sketch.document import Sketch


def chain(n: int, reverse: bool) -> dict:
    nodes = [{"id": "x", "type": "Input", "fields": {"shape": [8]}}]
    nodes += [{"id": f"r{i}", "type": "ReLU", "fields": {}} for i in range(n - 2)]
    nodes.append({"id": "out", "type": "Output", "fields": {}})
    ids = [nd["id"] for nd in nodes]
    edges = [{"src": a, "dst": b} for a, b in zip(ids, ids[1:], strict=False)]
    if reverse:
        edges.reverse()
    return {"format": "vramscope-sketch", "version": 1, "name": f"chain{n}", "nodes": nodes, "edges": edges}


def main(argv: list[str]) -> None:
    sizes = [int(a) for a in argv] or [2000, 10000]
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for reverse in (False, True):
                p = Path(tmp) / "s.json"
                p.write_text(json.dumps(chain(n, reverse)))
                t0 = time.perf_counter()
                sk = Sketch.load(p)
                t1 = time.perf_counter()
                sk.infer_shapes()
                t2 = time.perf_counter()
                order = "reversed" if reverse else "in order"
                print(f"{n:>6} nodes, edges {order:<9} load {t1 - t0:6.3f} s   shapes {t2 - t1:6.3f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
