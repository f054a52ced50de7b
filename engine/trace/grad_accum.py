"""Gradient accumulation's micro-steps: the first two are traced, the rest are copies of the second.

From the second micro-step on, each one starts with the same live tensors (parameters, the accumulated
gradients, optimizer state) and ends with them again, so it makes the same allocations and frees: the steady
state. Tracing two and copying the second (new storage keys, same ops, modules and sizes) gives the trace a
longer run would give, in the time of two; a run of a trillion micro-steps is shown as MAX_SHOWN of them,
which holds the same peaks. A second micro-step that is not self-contained (a storage it frees was made
before it, or one it makes outlives it) is not copied: the caller traces every micro-step for real.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config.train_config import TrainConfig
from .recorder import RawEvent

TRACED = 2  # micro-steps traced per optimizer step
MAX_SHOWN = 8  # micro-steps per optimizer step kept in the trace; later ones repeat the same allocations

_FB = ("forward", "backward")
Event = RawEvent


def traced_micro_steps(cfg: TrainConfig) -> int:
    return min(cfg.grad_accum, TRACED)


def shown_micro_steps(cfg: TrainConfig) -> int:
    return min(cfg.grad_accum, MAX_SHOWN)


def micro_step_ranges(events: list[Event], step: int) -> list[tuple[int, int]]:
    """[start, end) of each micro-step (a forward then its backward) of optimizer step `step`."""
    ranges: list[list[int]] = []
    last = None
    for i, e in enumerate(events):
        if e.step != step or e.phase not in _FB:
            continue
        if e.phase == "forward" and last != "forward":
            ranges.append([i, i + 1])
        elif ranges:
            ranges[-1][1] = i + 1
        last = e.phase
    return [(lo, hi) for lo, hi in ranges]


def self_contained(events: list[Event], lo: int, hi: int) -> bool:
    made = {e.storage for e in events[lo:hi] if e.nbytes > 0}
    freed = {e.storage for e in events[lo:hi] if e.nbytes < 0}
    return made == freed


def extend(events: list[Event], cfg: TrainConfig, new_key: Callable[[int], int], roles: dict[int, str],
           owner: dict[int, str]) -> list[Event] | None:
    """`events` with each optimizer step's last traced micro-step repeated up to shown_micro_steps(cfg);
    None when a repeat would not be exact (the caller then traces for real). `new_key(nbytes)` gives a key."""
    copies = shown_micro_steps(cfg) - traced_micro_steps(cfg)
    if copies <= 0:
        return events
    steps = sorted({e.step for e in events if e.phase in _FB})
    inserts: list[tuple[int, list[Event]]] = []
    for s in steps:
        ranges = micro_step_ranges(events, s)
        if len(ranges) != TRACED:
            return None
        lo, hi = ranges[-1]
        if not all(e.step == s and e.phase in _FB for e in events[lo:hi]) or not self_contained(events, lo, hi):
            return None
        added: list[Event] = []
        for _ in range(copies):
            keys: dict[int, int] = {}
            for e in events[lo:hi]:
                key = e.storage
                if key not in keys:
                    keys[key] = new_key(abs(e.nbytes))
                    if key in roles:
                        roles[keys[key]] = roles[key]
                    if key in owner:
                        owner[keys[key]] = owner[key]
                added.append(e._replace(storage=keys[key]))
        inserts.append((hi, added))
    out: list[Event] = []
    at = 0
    for hi, added in inserts:
        out.extend(events[at:hi])
        out.extend(added)
        at = hi
    out.extend(events[at:])
    return out


def note(cfg: TrainConfig) -> str | None:
    if cfg.grad_accum <= MAX_SHOWN:
        return None
    return (f"gradient accumulation over {cfg.grad_accum:,} micro-steps: micro-steps 3 to {cfg.grad_accum:,} repeat "
            f"the second's allocations exactly (the steady state); the timeline shows {MAX_SHOWN} of them")
