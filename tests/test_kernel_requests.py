"""Each kernel call's allocator requests, in order, found in real allocator traces from an NVIDIA H200 (torch 2.11,
cuDNN 9.19; tests/data/*.pickle.gz, recorded with C++ stacks).

The C++ frames say which op made each event (`at::_ops::convolution_backward::call`, and inside it
`cudnn_convolution_backward_input` / `_weight` and cuDNN's `run_conv_plan` for a workspace). From them the test
builds the spans the allocator's cumulative counters would give around each kernel op on a GPU, hands the frameless
events and those spans to engine.cuda.kernel_requests, and checks the requests against what the frames show: an output
wherever cuDNN allocated a result, the exact requested bytes wherever it allocated a workspace (and freed it inside
the op), in the order the kernel made them. A trace that lost an op's events leaves that op unpaired, never wrong.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from engine.cuda.gpu_profile import KERNEL_OPS, OUTPUT
from engine.cuda.kernel_requests import OpSpan, RecordedTrace, attach_requests, requests_from_trace
from engine.snapshots.file import load_snapshot_file

DATA = Path(__file__).parent / "data"
KERNEL_NAMES = {op.rsplit(".", 1)[0] for op in KERNEL_OPS}  # 'convolution_backward', ...
OP_FRAME = re.compile(r"at::_ops::(\w+)::call\(")
REQUESTS = ("alloc", "free_requested")


def _frames(e: dict[str, Any]) -> list[str]:
    return [str(f["name"]) for f in e.get("frames", [])]


def _kernel_op(e: dict[str, Any]) -> str | None:
    """The outermost kernel op (what the calibration's dispatch mode sees) on the event's stack, if any."""
    op = None
    for name in _frames(e):  # innermost first
        m = OP_FRAME.match(name)
        if m and m.group(1) in KERNEL_NAMES:
            op = m.group(1)
    return op


def _calls(events: list[dict[str, Any]]) -> list[tuple[str, list[int]]]:
    """(op, positions of its alloc / free_requested events) of each kernel op call, from the frames."""
    calls: list[tuple[str, list[int]]] = []
    current: tuple[str, list[int]] | None = None
    for i, e in enumerate(events):
        if e["action"] not in REQUESTS:
            continue
        op = _kernel_op(e)
        if op is None:
            current = None
            continue
        if current is None or current[0] != op:
            current = (op, [])
            calls.append(current)
        current[1].append(i)
    return calls


def _span(events: list[dict[str, Any]], first: int, last: int, offset: int = 0) -> OpSpan:
    """What the counters read before and after the op would be: allocations and frees made before / up to it."""
    def n(action: str, upto: int) -> int:
        return offset + sum(1 for e in events[:upto] if e["action"] == action)

    return OpSpan(n("alloc", first), n("alloc", last + 1), n("free_requested", first), n("free_requested", last + 1))


def _frameless(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace as calibration records it (no stacks): the function must not need the frames."""
    return [{k: v for k, v in e.items() if k != "frames"} for e in events]


def _totals(events: list[dict[str, Any]], offset: int = 0) -> tuple[int, int]:
    return (offset + sum(e["action"] == "alloc" for e in events),
            offset + sum(e["action"] == "free_requested" for e in events))


def _expected(events: list[dict[str, Any]], positions: list[int]) -> tuple[int, ...]:
    """The requests as the frames show them: a workspace is an allocation inside cuDNN's run_conv_plan (or, for
    attention, one the op itself freed); anything else the op allocated is an output."""
    out = []
    for p in positions:
        e = events[p]
        if e["action"] != "alloc":
            continue
        freed_inside = any(events[q]["action"] == "free_requested" and events[q]["addr"] == e["addr"]
                           for q in positions if q > p)
        is_conv_workspace = any("run_conv_plan" in f for f in _frames(e))
        if "convolution" in (_kernel_op(e) or ""):
            assert is_conv_workspace == freed_inside, (p, e["size"])  # the frames and the frees agree
        out.append(e["size"] if freed_inside else OUTPUT)
    return tuple(out)


@pytest.fixture(scope="module", params=["resnet18-b32-adam", "resnet18-b8-adam", "gpt2-b4-s512-adamw-ampbf16"])
def trace(request):
    return request.param, load_snapshot_file(DATA / f"{request.param}.pickle.gz")["device_traces"][0]


def test_every_kernel_call_of_a_real_trace_gets_its_requests_in_order(trace):
    stem, events = trace
    calls = _calls(events)
    ops = {op for op, _ in calls}
    if stem.startswith("resnet18"):  # 20 convolutions, two steps: each called 40 times forward and backward
        assert ops == {"convolution", "convolution_backward"}
        assert sum(op == "convolution" for op, _ in calls) == 40
        assert sum(op == "convolution_backward" for op, _ in calls) == 40
    else:  # 12 layers, two steps, cuDNN attention (bf16 on Hopper)
        assert ops == {"_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"}
        assert len(calls) == 48
    spans = [_span(events, pos[0], pos[-1]) for _, pos in calls]
    got = requests_from_trace(_frameless(events), spans, *_totals(events))
    for (op, pos), req in zip(calls, got, strict=True):
        assert req == _expected(events, pos), op
        assert req is not None and OUTPUT in req  # every kernel call here returns a storage


def test_convolution_backward_requests_are_grad_input_workspace_grad_weight_workspace():
    events = load_snapshot_file(DATA / "resnet18-b32-adam.pickle.gz")["device_traces"][0]
    calls = [(op, pos) for op, pos in _calls(events) if op == "convolution_backward"]
    got = requests_from_trace(_frameless(events), [_span(events, p[0], p[-1]) for _, p in calls], *_totals(events))
    # the first backward (the last layer's 512-channel 3x3 convolution, batch 32 at 7x7): grad_input 3,211,264 B,
    # cuDNN's backward-data workspace, grad_weight 9,437,184 B, its backward-filter workspace; the sizes are the
    # bytes requested, not the allocator's rounded blocks (21,365,247 is odd)
    assert got[0] == (OUTPUT, 15859728, OUTPUT, 21365247)
    first = [events[p] for p in calls[0][1] if events[p]["action"] == "alloc"]
    assert [e["size"] for e in first] == [3211264, 15859728, 9437184, 21365247]
    assert any("cudnn_convolution_backward_input" in f for f in _frames(first[1]))
    assert any("cudnn_convolution_backward_weight" in f for f in _frames(first[3]))
    # the layer that needs no grad_input (the stem convolution): grad_weight and its workspace alone
    assert sum(1 for r in got if r is not None and len(r) == 2 and r[0] == OUTPUT and r[1] > 0) == 2


def test_a_call_without_scratch_and_an_output_freed_after_the_op():
    events = load_snapshot_file(DATA / "resnet18-b32-adam.pickle.gz")["device_traces"][0]
    calls = _calls(events)
    got = requests_from_trace(_frameless(events), [_span(events, p[0], p[-1]) for _, p in calls], *_totals(events))
    no_scratch = [r for (op, _), r in zip(calls, got, strict=True) if op == "convolution" and r == (OUTPUT,)]
    assert len(no_scratch) == 2  # one convolution, once a step: cuDNN took no workspace
    # a forward output is freed long after its op (in the backward): it stays an output
    op, pos = calls[0]
    out = next(events[p] for p in pos if events[p]["action"] == "alloc")
    later = [i for i in range(pos[-1] + 1, len(events))
             if events[i]["action"] == "free_requested" and events[i]["addr"] == out["addr"]]
    assert later and got[0][0] == OUTPUT
    # counters that disagree (its allocations, but frees up to that later one) would take in other ops' events
    # between them: refused, not guessed
    own, wide = _span(events, pos[0], pos[-1]), _span(events, pos[0], later[0])
    bad = OpSpan(own.alloc_start, own.alloc_end, own.free_start, wide.free_end)
    assert requests_from_trace(_frameless(events), [bad], *_totals(events)) == [None]


@pytest.mark.parametrize("offset", [0, 1234])
def test_recording_that_began_mid_run_pairs_the_calls_it_holds(offset):
    """The counters count from the process's first allocation (offset: allocations made before the recorded part
    began); the trace keeps only the events from some point on. Calls wholly after it pair as in the full trace,
    the call it cuts through and those before it are unpaired."""
    events = load_snapshot_file(DATA / "resnet18-b32-adam.pickle.gz")["device_traces"][0]
    calls = _calls(events)
    full = requests_from_trace(_frameless(events), [_span(events, p[0], p[-1]) for _, p in calls], *_totals(events))
    cut_call = 21  # the second convolution_backward: the trace begins at the free of its first workspace
    assert calls[cut_call][0] == "convolution_backward"
    cut = calls[cut_call][1][2]
    spans = [_span(events, p[0], p[-1], offset) for _, p in calls]
    got = requests_from_trace(_frameless(events[cut:]), spans, *_totals(events, offset))
    for i, (g, f) in enumerate(zip(got, full, strict=True)):
        if i <= cut_call:
            assert g is None, i
        else:
            assert g == f, i
    assert sum(g is not None for g in got) == len(calls) - cut_call - 1 > 30


def test_a_truncated_ring_buffer_never_pairs_wrongly():
    """max_entries reached: the allocator kept the newest events only. Whatever the cut, every call comes out
    either exactly as in the full trace or unpaired."""
    events = load_snapshot_file(DATA / "resnet18-b8-adam.pickle.gz")["device_traces"][0]
    calls = _calls(events)
    spans = [_span(events, p[0], p[-1]) for _, p in calls]
    totals = _totals(events)
    full = requests_from_trace(_frameless(events), spans, *totals)
    for cut in range(0, len(events), 37):
        got = requests_from_trace(_frameless(events[cut:]), spans, *totals)
        for (_, pos), g, f in zip(calls, got, full, strict=True):
            assert g == (f if pos[0] >= cut else None), (cut, pos)


def test_counters_that_do_not_describe_the_trace_pair_nothing():
    events = load_snapshot_file(DATA / "resnet18-b8-adam.pickle.gz")["device_traces"][0]
    calls = _calls(events)
    spans = [_span(events, p[0], p[-1]) for _, p in calls]
    allocated, freed = _totals(events)
    # counters reset after recording began (fewer counted than the trace holds)
    assert requests_from_trace(_frameless(events), spans, allocated - 1, freed) == [None] * len(spans)
    # more frees counted than the trace could hold is fine; fewer is not
    assert requests_from_trace(_frameless(events), spans, allocated, freed - 1) == [None] * len(spans)


def test_attach_requests_adds_the_key_to_kernel_rows_alone():
    events = load_snapshot_file(DATA / "resnet18-b32-adam.pickle.gz")["device_traces"][0]
    calls = _calls(events)[:3]
    rows: list[dict[str, Any]] = [{"op": "aten.relu.default"}] + [{"op": f"aten.{op}.default"} for op, _ in calls]
    spans = [(i + 1, _span(events, p[0], p[-1])) for i, (_, p) in enumerate(calls)]
    rec = RecordedTrace(events=_frameless(events), allocated=_totals(events)[0], freed=_totals(events)[1])
    assert attach_requests(rows, spans, rec) == 3
    assert "requests" not in rows[0]
    assert [r["requests"] for r in rows[1:]] == [list(_expected(events, p)) for _, p in calls]
    assert attach_requests(rows, spans, None) == 0  # no trace (an old PyTorch): rows keep their peaks alone


def test_the_op_recorder_reads_the_counters_around_kernel_ops_alone(monkeypatch):
    """calibrate's dispatch mode (run here on the CPU, the CUDA memory figures stubbed to 0): the allocator's
    counters are read before and after each kernel op, and their span names that op's row."""
    import torch

    from engine.measure import calibrate

    reads = iter(range(0, 10_000, 1))
    monkeypatch.setattr(calibrate, "counters", lambda device: (next(reads), 0))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    rows: list[dict[str, Any]] = []
    spans: list[tuple[int, OpSpan]] = []
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with calibrate._op_recorder(rows, spans, 0):
        model(x).sum().backward()
    kernel_rows = [i for i, r in enumerate(rows) if r["op"].startswith("aten.convolution")]
    assert [i for i, _ in spans] == kernel_rows
    assert [rows[i]["op"] for i in kernel_rows] == ["aten.convolution.default"] * 2 + \
        ["aten.convolution_backward.default"] * 2
    assert [(s.alloc_start, s.alloc_end) for _, s in spans] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    no_spans: list[dict[str, Any]] = []
    with calibrate._op_recorder(no_spans):  # no trace recording: the counters are not read
        model(x).sum()
    assert next(reads) == 8


def test_a_scratch_held_across_a_later_request_is_not_encoded():
    """cuDNN's RNN keeps its workspace while it allocates the reserve: the encoding frees each scratch request
    before the next one, so such a call keeps its peak figure (None) instead of a sequence that would lower it."""
    ev = [{"action": "alloc", "addr": a, "size": n} for a, n in ((1, 1024), (2, 5120), (3, 7168))]
    ev += [{"action": "free_requested", "addr": 2, "size": 5120}]
    span = _span(ev, 0, len(ev) - 1)
    total = _totals(ev)
    assert requests_from_trace(ev, [span], *total) == [None]
    freed_first = ev[:2] + [ev[3], ev[2]]  # the workspace freed before the reserve: encodable
    assert requests_from_trace(freed_first, [_span(freed_first, 0, 3)], *_totals(freed_first)) == \
        [(OUTPUT, 5120, OUTPUT)]
