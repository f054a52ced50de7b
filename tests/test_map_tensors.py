"""engine.trace.step.map_tensors, the one walk over a model's example inputs (casting them, moving them to the GPU,
making the tracer's CPU copies, autocast's casts on a CUDA target): every tensor of a nested dict/tuple/list in
order, the containers' types and everything that is not a tensor kept."""

from __future__ import annotations

import torch

from engine.core.tensor_tree import map_tensors
from engine.trace.step import cast_inputs


def test_every_tensor_in_order_with_the_containers_kept():
    a, b, c = torch.zeros(2), torch.ones(3, dtype=torch.long), torch.full((1,), 2.0)
    seen: list[torch.Tensor] = []

    def visit(t: torch.Tensor) -> torch.Tensor:
        seen.append(t)
        return t + 1

    out = map_tensors({"x": (a, [b, "mask"]), "y": c, "n": 3}, visit)
    assert [t is u for t, u in zip(seen, (a, b, c), strict=True)] == [True, True, True]
    assert isinstance(out["x"], tuple) and isinstance(out["x"][1], list)
    assert out["x"][1][1] == "mask" and out["n"] == 3
    assert out["x"][0].tolist() == [1.0, 1.0] and out["y"].tolist() == [3.0]
    assert map_tensors("text", visit) == "text" and len(seen) == 3


def test_cast_inputs_casts_floating_tensors_alone():
    ids, x = torch.zeros(2, dtype=torch.long), torch.zeros(2)
    out = cast_inputs({"input_ids": ids, "pixels": [x]}, torch.bfloat16)
    assert out["input_ids"] is ids and out["pixels"][0].dtype == torch.bfloat16
