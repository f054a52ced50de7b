"""The engine calls the app makes, as plain picklable functions: they run in the bridge's engine process.

Qt-free on purpose: the worker process imports only this module and the engine. A model is named by a
source spec — ("sketch", sketch JSON) or ("ref", template name / sketch path / file.py:function) — so that
what crosses the process boundary is data, never a live model.
"""

from __future__ import annotations

from pathlib import Path


def make_source(spec: tuple):
    kind = spec[0]
    if kind == "sketch":
        from engine.sketch import Sketch
        from engine.sources import SketchSource

        _, data, *rest = spec
        path = Path(rest[0]) if rest and rest[0] else None
        return SketchSource(Sketch.from_json(data), path)
    if kind == "ref":
        from engine.sources import resolve_source

        return resolve_source(spec[1])
    raise ValueError(f"unknown source spec {kind!r}")


def estimate(spec: tuple, cfg, *, cancel=None, progress=None):
    from engine.estimator import estimate as run

    return run(make_source(spec), cfg, cancel=cancel, progress=progress)


def analytic(sketch_json: dict, cfg, *, cancel=None, progress=None):
    from engine.analytic import analytic as run
    from engine.sketch import Sketch

    return run(Sketch.from_json(sketch_json), cfg)


def max_batch(spec: tuple, cfg, budget_bytes: int, figure: str = "peak", *, cancel=None, progress=None):
    from engine.planner import max_batch as run

    return run(make_source(spec), cfg, budget_bytes, cancel=cancel, progress=progress, figure=figure)


def recommend(spec: tuple, cfg, gpu: str | None, base=None, *, cancel=None, progress=None):
    from engine.planner import recommend as run

    return run(make_source(spec), cfg, gpu=gpu, cancel=cancel, progress=progress, base=base)


def profile(spec: tuple, cfg, *, cancel=None, progress=None):
    """(measured, against): the real run here, and the estimate for the device it ran on when that is not the
    configured target (a CPU run of a GPU-target estimate), else None: compare the measurement with that."""
    from engine.estimator import estimate
    from engine.profiler import profile as run

    src = make_source(spec)
    measured = run(src, cfg, cancel=cancel, progress=progress)
    if measured.config.device == cfg.device:
        return measured, None
    return measured, estimate(src, cfg.with_(device=measured.config.device, gpu=None), cancel=cancel)


def module_tree(spec: tuple, cfg, *, cancel=None, progress=None) -> list[tuple[str, str, int, int]]:
    """(dotted name, type, own parameters, total parameters) of the model, built on the meta device."""
    import torch

    src = make_source(spec)
    with torch.device("meta"):
        model, _inputs = src.build(cfg.with_(batch_size=1))
    rows = []
    for name, mod in model.named_modules():
        own = sum(p.numel() for p in mod.parameters(recurse=False))
        total = sum(p.numel() for p in mod.parameters())
        rows.append((name, type(mod).__name__, own, total))
    return rows


def warm_up(*, cancel=None, progress=None) -> bool:
    """Import the engine's heavy modules once, so the first real job answers quickly."""
    import engine.estimator  # noqa: F401
    import engine.sources  # noqa: F401

    try:
        import engine.planner  # noqa: F401
        import engine.sketch  # noqa: F401
    except ImportError:
        pass
    return True


# --------------------------------------------------------------------------------------------------------------
# the worker process

def one_line(exc: BaseException) -> str:
    """A user-facing one-line message: UserError text as is; anything else named, first line only."""
    from engine.errors import UserError

    if isinstance(exc, UserError):
        text = str(exc)
    elif isinstance(exc, MemoryError):
        text = "out of host memory while estimating; try a smaller batch or sequence"
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    text = " ".join(text.split())  # one line, whatever the engine wrote
    return text if len(text) <= 300 else text[:297] + "…"


def resolve_target(target: str):
    """'package.module:function' → the function."""
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class _Token:
    """The cancel token a job sees in the worker process: set when the parent names this job in `cancel_id`."""

    def __init__(self, cancel_id, job_id: int):
        self._v, self._id = cancel_id, job_id

    def is_set(self) -> bool:
        return self._v.value == self._id


def serve(inbox, outbox, cancel_id) -> None:
    """Worker-process main loop: run (job id, pickled (target, args)) messages one at a time.

    Replies: ("started", id), ("progress", id, fraction, text), ("result", id, pickled value),
    ("error", id, one-line message, traceback text), ("cancelled", id).
    """
    import pickle
    import signal
    import time
    import traceback

    from engine.errors import Cancelled

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C in the terminal is the parent's to handle
    except (ValueError, OSError):
        pass
    while True:
        msg = inbox.get()
        if msg is None:
            return
        jid, payload = msg
        token = _Token(cancel_id, jid)
        last = [0.0]

        def progress(*args, **kwargs):
            if token.is_set():
                raise Cancelled()
            nums = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
            strs = [a for a in args if isinstance(a, str)]
            frac = float(nums[0]) / float(nums[1]) if len(nums) >= 2 and nums[1] else (float(nums[0]) if nums else -1.0)
            now = time.monotonic()
            if now - last[0] >= 0.05 or frac >= 1.0:  # a few updates a second is all a progress bar needs
                last[0] = now
                outbox.put(("progress", jid, max(-1.0, min(1.0, frac)), strs[0] if strs else str(kwargs.get("message", ""))))

        outbox.put(("started", jid))
        try:
            target, args = pickle.loads(payload)
            value = resolve_target(target)(*args, cancel=token, progress=progress)
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Cancelled:
            outbox.put(("cancelled", jid))
            continue
        except BaseException as e:  # noqa: BLE001 — the process must outlive any one job
            if isinstance(e, KeyboardInterrupt):
                return
            if token.is_set():
                outbox.put(("cancelled", jid))
            else:
                outbox.put(("error", jid, one_line(e), traceback.format_exc()))
            continue
        outbox.put(("cancelled", jid) if token.is_set() else ("result", jid, data))
