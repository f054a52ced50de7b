"""Autograd sums two gradients of one tensor in place when it holds the only reference to the first; under a
dispatch mode it cannot tell and adds out of place. The tracer records the in-place sum a real step makes
(engine.trace.recorder: take_over), checked against the same steps run for real under PyTorch's profiler."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config.train_config import TrainConfig
from engine.measure.cpu_profiler import measure_cpu
from engine.trace.recorder import StorageRecorder
from engine.trace.tracer import trace_model

FIX = Path(__file__).parent / "fixtures" / "gradient_sums.py"


def _backward_allocs(trace, word: str) -> list[int]:
    return sorted(e.nbytes for e in trace.events if e.nbytes > 0 and e.phase == "backward" and word in e.op)


@pytest.mark.parametrize("fn,optimizer", [("residual", "adam"), ("tied", "adamw"), ("residual", "sgd"),
                                          ("self_sum", "adam"), ("hook_keeps", "adam")])
def test_backward_sums_allocate_what_a_real_step_allocates(fn, optimizer):
    src = f"{FIX}:{fn}"
    for accum in (1, 2):
        cfg = TrainConfig(device="cpu", batch_size=4, optimizer=optimizer, grad_accum=accum)
        traced, _info = trace_model(src, cfg)
        real, _rinfo, _peak = measure_cpu(src, cfg)
        assert _backward_allocs(traced, "add") == _backward_allocs(real, "add"), (fn, accum)
        if fn == "residual":  # three blocks' inputs, each summed in place: no allocation
            assert _backward_allocs(real, "add") == []
        else:  # a gradient held twice (tied weight, h + h, a hook keeping it): out of place, once per backward
            assert len(_backward_allocs(real, "add")) == 2 * accum


def test_a_taken_over_storage_is_freed_once_when_the_sum_dies():
    rec = StorageRecorder()
    a, b = torch.ones(256), torch.ones(256)
    ka = rec.track(a, "grad")
    rec.track(b, "grad")
    s = a + b
    assert rec.take_over(s, a)
    assert rec.track(s, "add.Tensor") == ka  # the sum is the first gradient's bytes: no new allocation
    n = len(rec.events)
    del a
    assert len(rec.events) == n  # its bytes live on in the sum
    del s
    assert rec.events[-1].storage == ka and rec.events[-1].nbytes == -1024
    assert not rec.take_over(torch.ones(3), b)  # another size: not the same bytes
