"""Figures to compare before and after a restructuring, as one sorted JSON document on stdout: four
`benchmarks.gpu_compare` cases (without their seconds) and the estimate JSON of every fast CPU-zoo case (without
its "traced in … s" note and elapsed time). Run it on two trees, each in its own process, and diff the outputs:

    PYTHONPATH=<tree> python -m benchmarks.same_figures > figures.json
"""

from __future__ import annotations

import json
import re
import sys

from benchmarks import gpu_compare
from benchmarks.zoo_models import ZOO
from engine.planning.estimator import estimate

CASES = ("lstm", "plain cnn (no BN) fp32", "gpt2 fp32", "bert-base fp32 adam")


def figures() -> dict[str, object]:
    out: dict[str, object] = {"gpu_compare": [], "zoo": {}}
    rows = out["gpu_compare"]
    zoo = out["zoo"]
    assert isinstance(rows, list) and isinstance(zoo, dict)
    for only in CASES:
        for r in gpu_compare.compare(gpu_compare.DEFAULT, only):
            r.pop("seconds", None)
            rows.append(r)
    for case in ZOO:
        if not case.fast:
            continue
        j = estimate(case.source(), case.cfg).to_json()
        j["notes"] = [n for n in j.get("notes", []) if not re.search(r"\d+\.\d+ s\b", n)]
        j.pop("elapsed_s", None)
        zoo[case.label] = j
    return out


if __name__ == "__main__":
    sys.stdout.write(json.dumps(figures(), sort_keys=True, indent=1, default=str))
