"""Opening real PyTorch memory snapshots (tests/data: recorded on an H200, see ../shared/gpu/README.md) and
synthetic ones of known content; refusing bad and hostile files without running them."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import pytest

from benchmarks.snapshot_synth import make_snapshot, write
from engine.core.errors import UserError
from engine.snapshots.file import load_snapshot_file
from engine.snapshots.reader import open_snapshot, snapshot_estimate

DATA = Path(__file__).parent / "data"
RESNET18 = DATA / "resnet18-b8-adam.pickle.gz"
GPT2 = DATA / "gpt2-b4-s512-adamw-ampbf16.pickle.gz"
OOM = DATA / "resnet50-b256-oom-at-4gib.pickle.gz"
MiB = 1 << 20


def _active_at_dump(path: Path, key: str = "requested_size") -> int:
    data = load_snapshot_file(path)
    return sum(b[key] for s in data["segments"] for b in s["blocks"] if b["state"].startswith("active"))


def _requests_at_dump(path: Path) -> list[int]:
    data = load_snapshot_file(path)
    return [b["requested_size"] for s in data["segments"] for b in s["blocks"] if b["state"].startswith("active")]


@pytest.mark.parametrize("path", [RESNET18, GPT2, OOM], ids=lambda p: p.name.split(".")[0])
def test_history_replays_to_the_segments_pytorch_dumped(path):
    # Two independent parts of the real file agree: the live bytes after replaying the allocator's history equal the
    # active blocks in the segments PyTorch wrote at the dump; every instant's categories add up to its total.
    est = open_snapshot(path)
    assert est.source == "snapshot"
    assert est.timeline[-1].total == _active_at_dump(path)
    assert all(p.total == sum(p.by_category.values()) for p in est.timeline)
    assert est.peak_bytes == max(p.total for p in est.timeline)
    # the allocator counts blocks: requests in 512-byte units (the few blocks it did not split hold a little more)
    end_blocks = sum(-(-n // 512) * 512 for n in _requests_at_dump(path))
    assert end_blocks <= _active_at_dump(path, "size") < end_blocks * 1.01
    assert est.measured.max_memory_allocated >= est.peak_bytes
    assert est.gpu.reserved_bytes == sum(s["total_size"] for s in load_snapshot_file(path)["segments"])
    assert est.gpu.reserved_timeline and max(est.gpu.reserved_timeline) <= est.gpu.reserved_bytes


def test_oom_snapshot_names_the_failed_allocation_as_pytorch_reported_it():
    # The run's own error: "Tried to allocate 784.00 MiB … 3.11 GiB is allocated by PyTorch".
    est = open_snapshot(OOM)
    d = est.oom
    assert d.requested_bytes == 784 * MiB
    assert round(d.allocated_bytes / 2**30, 2) == 3.11
    assert d.phase == "forward" and d.step == 0
    assert d.op == "aten::batch_norm" and d.module.endswith("batchnorm.py")
    assert d.stack[0].startswith("torch/nn/functional.py") and "templates/resnet.py:49 in forward" in d.stack
    assert d.live_by_category["inputs"] == 256 * 3 * 224 * 224 * 4  # the batch, exactly
    assert sum(d.live_by_category.values()) == d.allocated_bytes
    assert "device still had" in est.oom.message  # a 4 GiB cap on a 141 GB GPU: the limit was the process's
    assert est.config.mode == "train"


def test_steps_phases_and_config_read_from_the_frames():
    est = open_snapshot(GPT2)
    phases = [(p.step, p.phase) for p in est.phases]
    assert phases == [(0, "setup"), (0, "forward"), (0, "backward"), (0, "optimizer"),
                      (1, "forward"), (1, "backward"), (1, "optimizer")]
    assert est.config.optimizer == "adamw" and est.config.precision == "amp-bf16"
    r18 = open_snapshot(RESNET18)
    assert r18.config.optimizer == "adam" and r18.config.precision == "fp32"
    assert r18.breakdown_at_peak["workspace"] > 0  # cuDNN convolution workspaces, named from their frames
    assert any(" › " in r.name for r in r18.per_module)


def test_snapshot_categories_match_the_estimate_of_the_same_step():
    # The tracer's categories are checked against the profiler elsewhere; the snapshot's, made from frames and
    # lifetimes alone, must agree with them on the real GPT-2 run (parameters and Adam moments to the byte).
    from engine.models.sources import resolve_source
    from engine.planning.estimator import estimate
    from engine.planning.snapshot_fit import compare, config_for

    snap = open_snapshot(GPT2)
    source = resolve_source("gpt2")
    cfg, notes = config_for(snap, source, {"seq_len": 512})
    assert cfg.batch_size == 4 and any("batch size 4" in n for n in notes)
    rows = {r[0].strip(): r for r in compare(snap, estimate(source, cfg)).rows}
    assert rows["parameters at the peak"][1] == rows["parameters at the peak"][2]
    assert abs(rows["optimizer_state at the peak"][3]) < 0.01
    assert abs(rows["activations at the peak"][3]) < 0.1
    assert abs(rows["max_memory_allocated"][3]) < 1.0


def test_synthetic_snapshot_figures_are_exact():
    data, exp = make_snapshot(6000, layers=16)
    est = snapshot_estimate(data)
    assert est.measured.max_memory_allocated == exp["peak"] == est.peak_bytes
    last = est.timeline[-1].by_category
    for cat, v in exp["live"].items():
        assert last.get(cat, 0) == v, cat
    assert est.breakdown_at_peak["gradients"] == exp["params"]  # one gradient per weight at the backward's end
    assert est.breakdown_at_peak["optimizer_state"] == 2 * exp["params"]  # Adam's two moments
    assert est.config.optimizer == "adam"
    assert max(p.step for p in est.phases) + 1 == exp["steps"]


def test_bounded_history_keeps_what_the_dropped_events_left_alive():
    # _record_memory_history(max_entries=N) keeps the newest N events: the blocks allocated before them are
    # reconstructed from their frees and from the segments, so the end state is still exact.
    data, exp = make_snapshot(6000, layers=16)
    full = snapshot_estimate(data)
    data["device_traces"] = [data["device_traces"][0][2500:]]
    cut = snapshot_estimate(data)
    assert cut.timeline[-1].total == full.timeline[-1].total
    assert cut.timeline[-1].by_category["optimizer_state"] == 2 * exp["params"]
    assert cut.snapshot.before_history > 0 and any("before the recorded history" in n for n in cut.notes)


def test_uncompressed_pickle_and_segments_only_snapshot(tmp_path):
    data = load_snapshot_file(OOM)
    plain = tmp_path / "run.pickle"
    plain.write_bytes(pickle.dumps(data))
    assert open_snapshot(plain).peak_bytes == open_snapshot(OOM).peak_bytes
    seg_only = tmp_path / "segments.pickle"
    seg_only.write_bytes(pickle.dumps(data["segments"]))  # torch.cuda.memory_snapshot(): no history
    est = open_snapshot(seg_only)
    assert est.timeline[-1].total == _active_at_dump(OOM)


class _Boom:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "executed"
    evil = tmp_path / "evil.pickle.gz"
    evil.write_bytes(gzip.compress(pickle.dumps({"segments": [], "device_traces": [[_Boom(marker)]]})))
    pickle.loads(pickle.dumps(_Boom(tmp_path / "control")))  # the same payload does run under plain pickle
    assert (tmp_path / "control").exists()
    with pytest.raises(UserError) as e:
        open_snapshot(evil)
    assert not marker.exists()
    msg = str(e.value)
    assert "\n" not in msg and "refused without running it" in msg and "system" in msg


@pytest.mark.parametrize("content,words", [
    (lambda: gzip.compress(pickle.dumps(load_snapshot_file(OOM)))[:4000], "cut short"),
    (lambda: pickle.dumps({"weights": [1, 2, 3]}), "not a PyTorch memory snapshot"),
    (lambda: pickle.dumps([1, 2, 3]), "not a PyTorch memory snapshot"),
    (lambda: b"this is a text file\n", "not a PyTorch memory snapshot"),
    (lambda: b"", "cut short"),
    (lambda: pickle.dumps({"segments": [], "device_traces": [[{"nothing": 1}]]}), "damaged"),
], ids=["truncated-gzip", "other-dict", "list", "text", "empty", "bad-entry"])
def test_bad_files_are_one_clear_line(tmp_path, content, words):
    p = tmp_path / "bad.pickle"
    p.write_bytes(content())
    with pytest.raises(UserError) as e:
        open_snapshot(p)
    assert words in str(e.value) and "\n" not in str(e.value) and str(p) in str(e.value)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        open_snapshot(tmp_path / "nope.pickle.gz")
    with pytest.raises(UserError, match="folder"):
        open_snapshot(tmp_path)


def test_progress_is_reported_and_cancel_stops(tmp_path):
    from engine.core.errors import Cancelled

    path = write(tmp_path / "s.pickle.gz", make_snapshot(20000, layers=16)[0])
    seen = []
    open_snapshot(path, progress=lambda f, m: seen.append((f, m)))
    fracs = [f for f, _ in seen]
    assert fracs == sorted(fracs) and fracs[-1] == 1.0 and len(seen) > 10

    class Stop:
        def is_set(self):
            return True

    with pytest.raises(Cancelled):
        open_snapshot(path, cancel=Stop())


def test_snapshots_written_by_vramscope_record_on_a_real_gpu():
    # benchmarks/snapshot_gpu_check.py on an H200 (benchmarks/gpu/h200/snapshot_check.txt): torch reported
    # max_memory_allocated 965,495,296 and max_memory_reserved 1,524,629,504 for the run that fit, and
    # "CUDA out of memory. Tried to allocate 1.53 GiB" for the one under a 2 GiB cap.
    fit = open_snapshot(DATA / "resnet18-b32-adam.pickle.gz")
    assert fit.gpu.reserved_bytes == 1_524_629_504
    assert abs(fit.measured.max_memory_allocated - 965_495_296) / 965_495_296 < 0.01
    assert fit.config.optimizer == "adam" and fit.oom is None
    oom = open_snapshot(DATA / "resnet18-b512-oom-at-2gib.pickle.gz").oom
    assert f"{oom.requested_bytes / 2**30:.2f}" == "1.53"
    assert oom.op == "aten::batch_norm" and oom.phase == "forward"
    assert oom.live_by_category["inputs"] == 512 * 3 * 224 * 224 * 4
    assert oom.reserved_bytes <= 2 * 2**30  # under the cap it was made to fail at
