"""An estimate's garbage collections skip the objects alive before it (engine.core.gc_scope), and give them back."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.core.gc_scope import YOUNG_THRESHOLD, older_objects_set_aside

MLP = Path(__file__).resolve().parent.parent / "resources" / "templates" / "mlp.json"


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


def test_objects_alive_before_are_set_aside_then_given_back() -> None:
    before = _Node()
    with older_objects_set_aside():
        assert gc.get_freeze_count() > 0  # `before` among them: no collection inside walks it
        assert not any(o is before for g in (0, 1, 2) for o in gc.get_objects(g))
    assert gc.get_freeze_count() == 0
    assert any(o is before for o in gc.get_objects(2))  # back in the oldest generation


def test_garbage_made_inside_is_still_collected_inside() -> None:
    with older_objects_set_aside():
        ref = weakref.ref(_Node())
        gc.collect()
        assert ref() is None


def test_garbage_made_before_is_collected_after() -> None:
    ref = weakref.ref(_Node())
    with older_objects_set_aside():
        gc.collect()
        assert ref() is not None  # set aside: left for later
    gc.collect()
    assert ref() is None


def test_nested_scopes_thaw_at_the_last_end() -> None:
    with older_objects_set_aside():
        with older_objects_set_aside():
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_its_own_objects_keeps_them_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither frozen again nor thawed by the scope. (Counted by the calls: the number of frozen objects is no
    measure, it drops as frozen objects die, on other threads too.)"""
    calls: list[str] = []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 1000)  # the process's own, set aside before
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    with older_objects_set_aside():
        pass
    assert calls == []


def test_estimate_traces_with_older_objects_set_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.config.train_config import TrainConfig
    from engine.planning import estimator

    seen: list[int] = []
    trace_model = estimator.trace_model

    def watched(*args: object, **kwargs: object) -> object:
        seen.append(gc.get_freeze_count())
        return trace_model(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(estimator, "trace_model", watched)
    est = estimator.estimate(str(MLP), TrainConfig(batch_size=4))
    assert est.peak_bytes > 0
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0


def test_the_planners_optimizer_swap_runs_with_older_objects_set_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.config.train_config import TrainConfig
    from engine.planning import reuse

    seen: list[int] = []

    def phases(*args: object) -> None:
        seen.append(gc.get_freeze_count())
        return None  # (declined: with_optimizer answers None)

    monkeypatch.setattr(reuse, "swappable", lambda base, cfg: True)
    monkeypatch.setattr(reuse, "_optimizer_phases", phases)
    cfg = TrainConfig(batch_size=4, optimizer="sgd")
    step = SimpleNamespace(swapped={})  # a traced step's answers kept so far: none
    assert reuse.with_optimizer(None, step, cfg) is None  # type: ignore[arg-type]
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0


def test_young_objects_are_collected_less_often_inside_then_as_before() -> None:
    before = gc.get_threshold()
    with older_objects_set_aside():
        with older_objects_set_aside():
            assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD  # until the last scope ends
    assert gc.get_threshold() == before


def test_a_process_threshold_of_its_own_is_kept() -> None:
    before = gc.get_threshold()
    try:
        for own in ((0, 10, 10), (YOUNG_THRESHOLD * 2, 10, 10)):  # collection off by threshold; a higher one
            gc.set_threshold(*own)
            with older_objects_set_aside():
                assert gc.get_threshold() == own
            assert gc.get_threshold() == own
    finally:
        gc.set_threshold(*before)
