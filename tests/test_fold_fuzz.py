"""The fold fuzz (benchmarks/fold_fuzz.py) on a few seeded cases: it runs, and none of its models folds wrongly."""

from __future__ import annotations

from benchmarks.fold_fuzz import run


def test_a_few_fuzzed_models_fold_right_or_decline() -> None:
    counts, notes = run(16, seed=3)
    assert counts["WRONG"] == 0, notes
    assert counts["failed"] == 0, notes
    assert counts["same"] >= 1 and counts["declined"] >= 1, counts  # (both outcomes drawn: the seed covers them)
