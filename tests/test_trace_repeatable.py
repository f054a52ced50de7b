"""The same step traced twice in one process gives the same trace: the first trace of a process (the fake tensor
cache empty) and the later ones (its hits) alike (engine.trace.recorder._UNCACHED)."""

from __future__ import annotations

from torch._subclasses.fake_tensor import FakeTensorMode

from benchmarks.fold_identity import canonical_events
from engine.config.train_config import TrainConfig
from engine.trace.tracer import trace_model


def test_an_lstm_traced_first_and_again_gives_the_same_events() -> None:
    """oneDNN's LSTM backward on the CPU target: its weight gradients are copied into new ones (an empty_strided
    each, as the real CPU run's profile shows), not taken as they come; with the fake tensor cache's outputs they
    were taken, so a process's first trace and its later ones differed."""
    cfg = TrainConfig(batch_size=1, seq_len=64, optimizer="adamw", device="cpu")
    FakeTensorMode.cache_clear()
    first, info1 = trace_model("lstm-lm", cfg)
    again, info2 = trace_model("lstm-lm", cfg)
    assert canonical_events(first, info1.storage_owner) == canonical_events(again, info2.storage_owner)
    copies = [e for e in again.events if e.step == 0 and e.phase == "backward" and e.module == "rnn"
              and e.op == "new_empty_strided.default" and e.nbytes > 0]
    assert len(copies) == 2  # the two layers' weight gradients of that size
