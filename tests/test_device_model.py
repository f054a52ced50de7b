"""The device model on hand-made traces: reserved bytes worked out by hand, context and workspaces, the fit verdict."""

from engine.config.train_config import TrainConfig
from engine.cuda.device_model import device_detail, gpu_figures
from engine.results.types import Estimate, MemEvent, TimelinePoint, Trace

MiB = 1024**2
WS = 8519680  # PyTorch's cuBLAS workspace before Hopper (':4096:2:16:8')


def _trace(spec):
    """(storage, bytes, phase, category[, op]) per event; the op is "aten::op" (no GEMM) unless given."""
    events = [MemEvent(i, storage, nbytes, cat, 0, phase, "", rest[0] if rest else "aten::op")
              for i, (storage, nbytes, phase, cat, *rest) in enumerate(spec)]
    return Trace(events=tuple(events), source="tracer", device="cuda")


def _estimate(trace, cfg):
    total, points = 0, []
    peak = peak_i = 0
    for e in trace.events:
        total += e.nbytes
        points.append(TimelinePoint(e.index, e.step, e.phase, e.module, e.op, {"activations": total}))
        if total > peak:
            peak, peak_i = total, e.index
    return Estimate(
        model_name="hand", config=cfg, parameters=0, trainable_parameters=0, peak_bytes=peak, peak_index=peak_i,
        peak_step=0, peak_phase="forward", peak_module="", peak_op="", breakdown_at_peak={"activations": peak},
        per_module=(), timeline=tuple(points), phases=(),
    )


SPEC = [  # a GEMM in each phase: each thread takes its cuBLAS workspaces inside its first GEMM, after its output
    (1, 4 * MiB, "setup", "parameters", "parameter"),
    (2, 6 * MiB, "forward", "activations", "mm.default"),
    (3, 2 * MiB, "backward", "gradients", "mm.default"),
    (2, -6 * MiB, "backward", "activations"),
]


def test_reserved_with_workspaces_worked_by_hand():
    # setup: 4 MiB → 20 MiB segment #1, split: 16 MiB free. Forward GEMM: 6 MiB from it (10 MiB left, split).
    # After it, the forward thread's cuBLAS workspace (8,519,680 B = 8.125 MiB) takes the 10 MiB block (1.875 MiB
    #   left, split); its 1 MiB cuBLASLt workspace → small pool, 2 MiB segment #2 (1 MiB left). Reserved 22 MiB.
    # Backward GEMM: 2 MiB, no free large block that big (1.875) → 20 MiB segment #3 (18 MiB left). Reserved 42.
    # After it, autograd's thread's cuBLAS workspace takes the 18 MiB block (best fit among 1.875 and 18), its
    #   cuBLASLt 1 MiB segment #2's free 1 MiB exactly; then the 6 MiB of activations are freed. Reserved 42 MiB.
    trace = _trace(SPEC)
    cfg = TrainConfig()
    d = device_detail(trace, _estimate(trace, cfg), cfg, context_bytes=300 * MiB)
    f = d.figures
    assert list(d.replay.reserved) == [20 * MiB, 20 * MiB, 42 * MiB, 42 * MiB]
    assert f.reserved_bytes == 42 * MiB and f.segments == 3
    assert f.workspace_bytes == 2 * (WS + MiB)
    assert f.nvidia_smi_bytes == 342 * MiB
    # allocated peaks after autograd's workspaces: 4 + 6 + 2 MiB of tensors + two workspaces of 8.125 + 1 MiB
    assert d.max_memory_allocated == 12 * MiB + 2 * (WS + MiB)
    assert f.reserved_timeline == (20 * MiB, 20 * MiB, 42 * MiB, 42 * MiB)
    assert f.fits is None and f.gpu_name is None
    # The reserve first peaks at the backward GEMM (event 2); of the instants after an event, allocated is highest
    # after event 3 (both threads' workspaces, the activations freed): the split where memory is tightest is taken
    # there, and adds up to the reserve then (42 MiB) plus the context. What the reserve holds beyond the live
    # blocks is the allocator's cache of free blocks.
    assert f.reserved_peak_at == "step 1, backward, (model)" and d.replay.peak_reserved_index == 2
    assert d.replay.peak_allocated_index == 3 and f.live_peak_at == "step 1, backward, (model)"
    live = 4 * MiB + 2 * MiB + 2 * (WS + MiB)
    assert f.reserved_at_live_peak_bytes == 42 * MiB and f.cached_free_bytes == 42 * MiB - live
    assert f.breakdown_at_live_peak == {
        "parameters": 4 * MiB, "gradients": 2 * MiB, "workspace": 2 * (WS + MiB),
        "allocator_overhead": 42 * MiB - live, "cuda_context": 300 * MiB,
    }
    assert sum(f.breakdown_at_live_peak.values()) == f.reserved_at_live_peak_bytes + f.cuda_context_bytes


def test_a_step_without_a_gemm_takes_no_workspace():
    trace = _trace([(1, 4 * MiB, "setup", "parameters"), (2, 6 * MiB, "forward", "activations", "convolution.default"),
                    (3, 2 * MiB, "backward", "gradients", "convolution_backward.default")])
    cfg = TrainConfig()
    f = device_detail(trace, _estimate(trace, cfg), cfg, context_bytes=300 * MiB).figures
    assert f.workspace_bytes == 0 and f.reserved_bytes == 20 * MiB  # the three tensors share segment #1


def test_smi_breakdown_is_taken_at_the_live_peak_not_at_the_end():
    # 6 MiB of activations take a 20 MiB segment; freed, the segment stays cached, so the reserve peaks at the
    # allocation while the 2 MiB of gradients arrive later into the same cached segment: the live peak is the
    # first event, and the split is taken there.
    trace = _trace([(1, 6 * MiB, "forward", "activations"), (1, -6 * MiB, "backward", "activations"),
                    (2, 2 * MiB, "backward", "gradients")])
    cfg = TrainConfig()
    d = device_detail(trace, _estimate(trace, cfg), cfg, context_bytes=100 * MiB, include_workspaces=False)
    assert list(d.replay.reserved) == [20 * MiB, 20 * MiB, 20 * MiB]
    assert d.figures.breakdown_at_live_peak == {
        "activations": 6 * MiB, "allocator_overhead": 14 * MiB, "cuda_context": 100 * MiB}
    assert d.figures.cached_free_bytes == 14 * MiB and d.figures.live_peak_at == "step 1, forward, (model)"


def test_fits_and_margin_on_a_catalogue_gpu():
    trace = _trace(SPEC)
    cfg = TrainConfig(gpu="T4")
    f = device_detail(trace, _estimate(trace, cfg), cfg, context_bytes=300 * MiB).figures
    # torch reports a T4's usable memory as 15102 MiB
    assert f.fits is True and f.margin_bytes == (15102 - 342) * MiB
    assert f.gpu_total_bytes == 15360 * MiB


def test_does_not_fit_reports_negative_margin():
    trace = _trace([(1, 14 * 1024 * MiB, "setup", "parameters"), (2, 600 * MiB, "forward", "activations")])
    cfg = TrainConfig(gpu="T4", mode="inference")
    d = device_detail(trace, _estimate(trace, cfg), cfg, context_bytes=300 * MiB)
    assert d.figures.fits is False and d.figures.margin_bytes < 0
    assert d.replay.oom_index == 1
    assert any("out of memory" in n for n in d.notes)


def test_hopper_workspace_is_larger_and_context_from_table():
    trace = _trace(SPEC)
    cfg = TrainConfig(gpu="H100")
    f = gpu_figures(trace, _estimate(trace, cfg), cfg)
    assert f.workspace_bytes == 2 * (32 * MiB + MiB)
    assert 250 * MiB <= f.cuda_context_bytes <= 1200 * MiB
    assert f.nvidia_smi_bytes == f.reserved_bytes + f.cuda_context_bytes


def test_alloc_conf_changes_reserved():
    # 21 MiB then 23 MiB, each freed before the next: 22 + 24 MiB segments natively, one 40 MiB expandable
    # segment (two 20 MiB pages) with expandable_segments:True.
    spec = [(1, 21 * MiB, "forward", "activations"), (1, -21 * MiB, "forward", "activations"),
            (2, 23 * MiB, "forward", "activations")]
    trace = _trace(spec)
    for conf, expected in ((None, 46 * MiB), ("expandable_segments:True", 40 * MiB)):
        cfg = TrainConfig(mode="inference", alloc_conf=conf)
        d = device_detail(trace, _estimate(trace, cfg), cfg, context_bytes=0, include_workspaces=False)
        assert d.figures.reserved_bytes == expected


def test_cuda_profile_merges_the_allocator_history():
    # The tracker saw a parameter (setup) and one forward tensor at 0x1000; the allocator's history also holds
    # a cuBLAS workspace the tracker never saw: it becomes a temporary of the op that was running.
    from engine.measure.cuda_profiler import merge_device_trace
    from engine.trace.recorder import RawEvent

    rec_events = [RawEvent(0, 4096, 0, "setup", "", "parameter"), RawEvent(1, 1024, 0, "forward", "fc", "mm"),
                  RawEvent(1, -1024, 0, "forward", "fc", "mm")]
    alloc_index, nbytes, ptr_of = {0: 0, 1: 1}, {0: 4096, 1: 1024}, {0: 0x100, 1: 0x1000}
    device_trace = [
        {"action": "segment_alloc", "addr": 0x1000, "size": 2 * MiB},
        {"action": "alloc", "addr": 0x1000, "size": 1024},
        {"action": "segment_alloc", "addr": 0x9000, "size": 20 * MiB},
        {"action": "alloc", "addr": 0x9000, "size": WS},
        {"action": "free_requested", "addr": 0x1000, "size": 1024},
        {"action": "free_completed", "addr": 0x1000, "size": 1024},
    ]
    trace, reserved = merge_device_trace(rec_events, alloc_index, nbytes, ptr_of, device_trace,
                                         {0: "parameters"}, TrainConfig(), reserved0=20 * MiB)
    assert [(e.nbytes, e.category) for e in trace.events] == [
        (4096, "parameters"), (1024, "temporaries"), (WS, "temporaries"), (-1024, "temporaries")]
    assert trace.events[2].module == "fc" and "inside the op" in trace.events[2].op
    assert reserved == [20 * MiB, 22 * MiB, 42 * MiB, 42 * MiB]
    assert trace.source == "profiler-cuda"


def _traced(model="resnet18", **kw):
    from engine.trace.summary import summarise
    from engine.trace.tracer import trace_model

    cfg = TrainConfig(gpu="T4", **kw)
    trace, info = trace_model(model, cfg)
    return trace, summarise(trace, info, cfg), cfg


def test_verdict_fits_tight_at_capacity_and_does_not_fit():
    """The same step against less and less memory (the context standing in for what else holds the GPU): fits,
    then 'tight' with the allocator freeing its cache and retrying, then 'does not fit' once the live tensors
    alone exceed what is left."""
    from engine.config.gpus import find_gpu

    trace, est, cfg = _traced(batch_size=16)
    usable = find_gpu("T4").usable_bytes
    free = device_detail(trace, est, cfg, context_bytes=500 * MiB)
    assert free.figures.verdict == "fits" and free.figures.fits and not free.figures.at_capacity
    alloc, reserved = free.replay.peak_allocated, free.replay.peak_reserved
    assert reserved > alloc + 40 * MiB  # a cache to give back
    squeezed = device_detail(trace, est, cfg, context_bytes=usable - (alloc + reserved) // 2)
    f = squeezed.figures
    assert f.verdict == "tight" and f.at_capacity and f.fits and "capacity" in f.verdict_reason
    assert f.reserved_bytes <= usable - f.cuda_context_bytes  # it stayed within the GPU
    full = device_detail(trace, est, cfg, context_bytes=usable - alloc // 2)
    assert full.figures.verdict == "does not fit" and full.figures.fits is False


def test_the_range_and_the_split_of_measured_and_modelled_add_up():
    trace, est, cfg = _traced(batch_size=8)
    f = device_detail(trace, est, cfg).figures
    assert f.nvidia_smi_low_bytes < f.nvidia_smi_bytes < f.nvidia_smi_high_bytes
    assert f.measured_bytes + f.modelled_bytes == f.nvidia_smi_bytes
    assert f.assumed_gpu == "T4 16GB" or f.assumed_gpu.startswith("T4")


def test_sharded_split_adds_up_per_rank():
    """--world-size 8 --strategy zero2: nvidia-smi's split by category adds up to the per-rank figure, and the
    per-rank max_memory_allocated sits between the rank's live peak and its reserve (issue 16, item 4)."""
    from engine.planning.estimator import estimate

    single = estimate("gpt2", TrainConfig(batch_size=2, seq_len=256, optimizer="adamw", gpu="H200"))
    rank = estimate("gpt2", TrainConfig(batch_size=2, seq_len=256, optimizer="adamw", gpu="H200", world_size=8,
                                        strategy="zero2"))
    g = rank.gpu
    assert sum(g.breakdown_at_live_peak.values()) == g.reserved_at_live_peak_bytes + g.cuda_context_bytes
    assert g.reserved_at_live_peak_bytes <= g.reserved_bytes
    assert rank.peak_bytes <= rank.replay.max_memory_allocated <= g.reserved_bytes
    assert rank.replay.max_memory_allocated < single.replay.max_memory_allocated
    assert g.breakdown_at_live_peak.get("optimizer_state", 0) < single.gpu.breakdown_at_live_peak.get(
        "optimizer_state", 1)
