"""A synthetic PyTorch memory snapshot of any length, in the layout torch.cuda.memory._dump_snapshot writes
(the real ones in tests/data show it): a model of `layers` linear layers trained with Adam for as many steps as
the event count needs, with Python and C++ frames shared between events as PyTorch's pickles share them.

Its figures are known by construction (`expected`), so the reader can be checked against them; and it is the
long run the speed benchmark opens: `python -m benchmarks.snapshot_synth --events 1000000`.
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import time
from pathlib import Path

MiB = 1 << 20


def _fr(name: str, filename: str = "??", line: int = 0) -> dict:
    return {"name": name, "filename": filename, "line": line}


def _frames() -> dict[str, list[dict]]:
    """The frame lists of each kind of event, innermost first (what the allocator's unwinder records)."""
    torch_nn = "/usr/lib/python3/site-packages/torch/nn/modules"
    alloc = [_fr("torch::unwind::unwind()"), _fr("torch::CapturedTraceback::gather(bool, bool, bool)"),
             _fr("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)",
                 "CUDACachingAllocator.cpp")]
    main = [_fr("run_steps", "/home/u/train.py", 40), _fr("_PyEval_EvalFrameDefault"), _fr("Py_RunMain"),
            _fr("__libc_start_main")]
    call = [_fr("_call_impl", f"{torch_nn}/module.py", 1790), _fr("_wrapped_call_impl", f"{torch_nn}/module.py", 1779)]
    return {
        "param": alloc + [_fr("at::_ops::_to_copy::call(at::Tensor const&)"),
                          _fr("convert", f"{torch_nn}/module.py", 1370), _fr("_apply", f"{torch_nn}/module.py", 965),
                          _fr("to", f"{torch_nn}/module.py", 1384)] + main,
        "input": alloc + [_fr("at::_ops::_to_copy::call(at::Tensor const&)"),
                          _fr("torch::autograd::THPVariable_to(_object*, _object*, _object*)")] + main,
        "forward": alloc + [_fr("at::_ops::addmm::call(at::Tensor const&)"),
                            _fr("forward", f"{torch_nn}/linear.py", 134)] + call
                  + [_fr("forward", "/home/u/model.py", 12)] + call + main,
        "forward_tmp": alloc + [_fr("at::_ops::gelu::call(at::Tensor const&)"),
                                _fr("forward", "/home/u/model.py", 13)] + call + main,
        "backward": alloc + [_fr("at::_ops::mm::call(at::Tensor const&)"),
                             _fr("torch::autograd::Engine::evaluate_function(...)"),
                             _fr("torch::autograd::Engine::thread_main(...)"), _fr("__clone")],
        "optimizer": alloc + [_fr("at::_ops::zeros_like::call(at::Tensor const&)"),
                              _fr("_init_group", "/usr/lib/python3/site-packages/torch/optim/adam.py", 170),
                              _fr("step", "/usr/lib/python3/site-packages/torch/optim/adam.py", 230)] + main,
        "optimizer_tmp": alloc + [_fr("at::_ops::_foreach_sqrt::call(at::TensorList)"),
                                  _fr("_multi_tensor_adam", "/usr/lib/python3/site-packages/torch/optim/adam.py", 600),
                                  _fr("step", "/usr/lib/python3/site-packages/torch/optim/adam.py", 230)] + main,
        "free": [_fr("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free("
                     "c10::cuda::CUDACachingAllocator::Block*)")] + main,
    }


def make_snapshot(events: int = 10_000, layers: int = 64, oom: bool = False) -> tuple[dict, dict]:
    """(snapshot dict, expected figures). About `events` trace entries; with `oom`, the last step's forward ends
    in an out-of-memory entry."""
    fr = _frames()
    trace: list[dict] = []
    t = [1_000_000]
    addr = [0x7F00_0000_0000]
    live: dict[int, tuple[int, str, str]] = {}
    reserved = [0]
    seg_size = 1 << 30
    cats = {"parameters": 0, "inputs": 0, "activations": 0, "gradients": 0, "optimizer_state": 0, "temporaries": 0}
    total = [0]
    peak = [0]

    def ev(action: str, a: int, size: int, frames: list[dict]) -> None:
        t[0] += 7
        trace.append({"action": action, "addr": a, "size": size, "stream": 0, "time_us": t[0],
                      "frames": list(frames), "compile_context": "N/A", "user_metadata": ""})

    def alloc(size: int, kind: str, cat: str) -> int:
        while total[0] + size > reserved[0]:
            ev("segment_alloc", 0x7E00_0000_0000 + reserved[0], seg_size, fr[kind])
            reserved[0] += seg_size
        a = addr[0]
        addr[0] += size
        ev("alloc", a, size, fr[kind])
        live[a] = (size, cat, kind)
        cats[cat] += size
        total[0] += size
        peak[0] = max(peak[0], total[0])
        return a

    def free(a: int) -> None:
        size, cat, _kind = live.pop(a)
        ev("free_requested", a, size, fr["free"])
        ev("free_completed", a, size, fr["free"])
        cats[cat] -= size
        total[0] -= size

    w, act, tmp = 4 * MiB, 2 * MiB, 1 * MiB
    params = [alloc(w, "param", "parameters") for _ in range(layers)]
    state: list[int] = []
    grads: list[int] = []
    per_step = layers * 15 + 3  # trace entries in one step (the first adds 2 × layers of optimizer state)
    steps = max(1, -(-(events - len(trace) - 2 * layers) // per_step))
    annotations: list[dict] = []
    for step in range(steps):
        x = alloc(512 * 1024, "input", "inputs")
        saved = []
        for i in range(layers):
            saved.append(alloc(act, "forward", "activations"))
            free(alloc(tmp, "forward_tmp", "temporaries"))
            if oom and step == steps - 1 and i == layers // 2:
                t[0] += 7
                trace.append({"action": "oom", "addr": 0, "size": 3 * seg_size, "stream": 0, "time_us": t[0],
                              "device_free": 123 * MiB, "frames": list(fr["forward"]), "compile_context": "N/A",
                              "user_metadata": ""})
                return _finish(trace, live, reserved[0], annotations, fr), {
                    "peak": peak[0], "live": dict(cats), "steps": step + 1, "params": layers * w,
                    "oom_request": 3 * seg_size, "reserved": reserved[0]}
        for i in reversed(range(layers)):
            grads.append(alloc(w, "backward", "gradients"))
            free(alloc(tmp, "backward", "temporaries"))
            free(saved[i])
        free(x)
        annotations.append({"stage": "START", "name": "Optimizer.step#Adam.step", "device": 0, "time_us": t[0] + 1})
        if step == 0:
            state = [alloc(w, "optimizer", "optimizer_state") for _ in range(2 * layers)]
        for _ in range(layers):
            free(alloc(tmp, "optimizer_tmp", "temporaries"))
        annotations.append({"stage": "END", "name": "Optimizer.step#Adam.step", "device": 0, "time_us": t[0] + 1})
        for g in grads:
            free(g)
        grads = []
    del params, state
    return _finish(trace, live, reserved[0], annotations, fr), {
        "peak": peak[0], "live": dict(cats), "steps": steps, "params": layers * w, "reserved": reserved[0]}


def _finish(trace: list[dict], live: dict[int, tuple[int, str, str]], reserved: int, annotations: list,
            fr: dict[str, list[dict]]) -> dict:
    # live blocks carry the stack of their allocation, as PyTorch's do
    blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": list(fr[k])}
              for a, (s, _c, k) in sorted(live.items())]
    used = sum(s for s, _c, _k in live.values())
    if reserved > used:
        blocks.append({"address": 0x7D00_0000_0000, "size": reserved - used, "requested_size": 0, "state": "inactive",
                       "frames": []})
    seg = {"device": 0, "address": 0x7E00_0000_0000, "total_size": reserved, "allocated_size": used,
           "active_size": used, "requested_size": used, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
    return {"segments": [seg], "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False},
            "external_annotations": annotations}


def write(path: Path, data: dict) -> Path:
    raw = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
    path.write_bytes(gzip.compress(raw, compresslevel=1) if path.name.endswith(".gz") else raw)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--out", default="/tmp/vramscope-synth.pickle.gz")
    ap.add_argument("--plain", action="store_true", help="also time the uncompressed .pickle")
    args = ap.parse_args()
    t0 = time.perf_counter()
    data, expected = make_snapshot(args.events, layers=256)
    path = write(Path(args.out), data)
    n = len(data["device_traces"][0])
    t1 = time.perf_counter()
    print(f"wrote {path}: {n:,} events, {path.stat().st_size / MiB:.1f} MiB, in {t1 - t0:.1f} s")
    del data
    from engine.snapshots.file import load_snapshot_file
    from engine.snapshots.reader import open_snapshot

    for p in (path,) + ((write(Path(args.out).with_suffix(""), make_snapshot(args.events, layers=256)[0]),)
                        if args.plain else ()):
        c0, w0 = time.process_time(), time.perf_counter()
        load_snapshot_file(p)
        c1, w1 = time.process_time(), time.perf_counter()
        est = open_snapshot(p)
        c2, w2 = time.process_time(), time.perf_counter()
        ok = est.peak_bytes == expected["peak"]
        print(f"{p.name}: read alone {w1 - w0:.2f} s wall ({c1 - c0:.2f} s CPU); open (read + categories + "
              f"timeline) {w2 - w1:.2f} s wall ({c2 - c1:.2f} s CPU); peak {est.peak_bytes:,} bytes, expected "
              f"{expected['peak']:,}: {'equal' if ok else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
