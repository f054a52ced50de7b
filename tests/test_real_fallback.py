"""A step fake tensors cannot trace (an op whose output size depends on the data): the tracer hands it to the
real run its caller gives it (engine.measure.real_fallback, a real CPU step measured by the profiler) and never runs one
of its own; the estimator passes it, so the estimate is the measured step."""

from __future__ import annotations

import pytest

import engine.trace.tracer as tracer
from benchmarks.zoo_models import ZOO
from engine.core.errors import UserError
from engine.measure.cpu_profiler import measure_cpu
from engine.measure.real_fallback import run_for_real
from engine.planning.estimator import estimate
from engine.planning.reuse import traced_step

CASE = next(c for c in ZOO if c.label.startswith("data-dependent"))


def test_the_tracer_alone_gives_one_line_naming_the_data_dependent_op():
    with pytest.raises(UserError, match="depends on the data"):
        tracer.trace_model(CASE.source(), CASE.cfg)


def test_the_real_run_handed_in_is_the_measured_step():
    seen = []

    def real_run(source, cfg, info, err, cancel, partial):
        seen.append(partial)
        return run_for_real(source, cfg, info, err, cancel, partial)

    trace, info = tracer.trace_model(CASE.source(), CASE.cfg, real_run=real_run)
    measured, _info, _peak = measure_cpu(CASE.source(), CASE.cfg)
    assert len(seen) == 1 and seen[0] > 0  # the fake trace had got somewhere before the op
    assert [(e.nbytes, e.category) for e in trace.events] == [(e.nbytes, e.category) for e in measured.events]
    assert "measured with a real run on the CPU" in info.notes[-1]


def test_the_estimator_passes_the_real_run():
    est = estimate(CASE.source(), CASE.cfg)
    assert "measured with a real run on the CPU" in " ".join(est.notes)


def test_the_trace_the_planner_keeps_is_the_estimators_too():
    # plan, report and the app's estimate keep the traced step (engine.planning.reuse.traced_step): the same real run
    est, step = traced_step(CASE.source(), CASE.cfg)
    assert "measured with a real run on the CPU" in " ".join(est.notes)
    assert step.info.method == "real-cpu"
