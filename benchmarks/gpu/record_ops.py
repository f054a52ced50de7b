"""Copied from the shared GPU measurements (shared/gpu/record_ops.py) so it travels with the project; this copy adds
the held-out models of benchmarks/gpu_models.py. On a CUDA machine: the real two steps of the project's own templates, each aten op seen by a dispatch mode that
records its inputs, its output bytes, torch.cuda.memory_allocated() before and after it and the peak inside it
(so cuDNN/cuBLAS workspaces, RNN reserves and caches show), plus a head line per case with the run's figures.
Usage, from the project's root: python benchmarks/gpu/record_ops.py . OUT.jsonl.gz [--held-out-only]"""
import gzip
import json
import os
import subprocess
import sys

CASES = [  # template, TrainConfig fields
    ("resnet18", dict(batch_size=8, optimizer="adam")),
    ("resnet50", dict(batch_size=32, optimizer="adam")),
    ("resnet50", dict(batch_size=64, optimizer="sgd-momentum", precision="amp-fp16")),
    ("resnet50", dict(batch_size=128, mode="inference", precision="amp-fp16")),
    ("vgg16", dict(batch_size=16, optimizer="sgd")),
    ("mobilenet_v2", dict(batch_size=32, optimizer="adam")),
    ("unet", dict(batch_size=4, optimizer="adamw")),
    ("lstm-lm", dict(batch_size=16, optimizer="adam")),
    ("gpt2", dict(batch_size=4, seq_len=512, optimizer="adamw")),
    ("bert-base", dict(batch_size=16, seq_len=128, optimizer="adam", precision="amp-fp16")),
    ("vit-b16", dict(batch_size=16, optimizer="adamw", precision="amp-bf16")),
]
HELD_OUT = [  # benchmarks/gpu_models.py, the same settings as benchmarks/validate_gpu.py's held-out cases
    ("benchmarks/gpu_models.py:lstm_lm", dict(batch_size=32, optimizer="adam")),
    ("benchmarks/gpu_models.py:gru_lm", dict(batch_size=16, optimizer="adamw", precision="amp-fp16")),
    ("benchmarks/gpu_models.py:plain_cnn", dict(batch_size=64, optimizer="adam")),
    ("benchmarks/gpu_models.py:plain_cnn", dict(batch_size=128, optimizer="sgd-momentum", precision="amp-bf16")),
    ("benchmarks/gpu_models.py:transformer_encoder", dict(batch_size=32, optimizer="adamw")),
    ("benchmarks/gpu_models.py:transformer_encoder", dict(batch_size=64, mode="inference", precision="fp16")),
    ("benchmarks/gpu_models.py:seq2seq", dict(batch_size=16, optimizer="adamw", precision="amp-bf16")),
    ("benchmarks/gpu_models.py:t5_small", dict(batch_size=8, optimizer="adamw")),
    ("unet", dict(batch_size=8, optimizer="adamw", precision="amp-bf16")),
]

CHILD = r'''
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from engine.config import TrainConfig
from engine.sources import resolve_source
from engine.step import DTYPES, cast_inputs, run_steps
name, kw = sys.argv[2], json.loads(sys.argv[3])
cfg = TrainConfig(device="cuda", **kw)
model, inputs = resolve_source(name).build(cfg)
if cfg.precision in ("fp16", "bf16"):
    model.to(DTYPES[cfg.precision]); inputs = cast_inputs(inputs, DTYPES[cfg.precision])
def to_cuda(x):
    if isinstance(x, torch.Tensor): return x.to("cuda")
    if isinstance(x, dict): return {k: to_cuda(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)): return type(x)(to_cuda(v) for v in x)
    return x
torch.cuda.init(); model.to("cuda"); inputs = to_cuda(inputs); torch.cuda.synchronize()
rows = []
class OpMem(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
        out = func(*args, **kwargs)
        peak, after = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
        seen, ob = set(), 0
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                s = t.untyped_storage()
                if s.data_ptr() not in seen:
                    seen.add(s.data_ptr()); ob += s.nbytes()
        ins = [[list(t.shape), str(t.dtype).replace("torch.", "")] for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        rows.append({"op": str(func), "in": ins, "out": ob, "before": before, "after": after, "peak": peak})
        return out
amp = torch.autocast("cuda", dtype=DTYPES[cfg.precision]) if cfg.amp else None
t0 = time.time()
with OpMem():
    if amp is not None:
        with amp: run_steps(model, inputs, cfg, lambda s, p: None)
    else:
        run_steps(model, inputs, cfg, lambda s, p: None)
torch.cuda.synchronize()
head = {"case": name, "config": kw, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(), "ops": len(rows), "peak_allocated": max(r["peak"] for r in rows),
        "reserved_now": torch.cuda.memory_reserved(), "seconds": round(time.time() - t0, 1)}
print(json.dumps(head))
for r in rows: print(json.dumps(r, separators=(",", ":")))
'''

if __name__ == "__main__":
    proj, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    with gzip.open(out, "wt") as f:
        for name, kw in (HELD_OUT if "--held-out-only" in sys.argv else CASES + HELD_OUT):
            try:
                p = subprocess.run([sys.executable, "-c", CHILD, proj, name, json.dumps(kw)], capture_output=True, text=True, timeout=60, cwd=proj)
                text = p.stdout if p.returncode == 0 else json.dumps({"case": name, "config": kw, "error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}) + "\n"
            except subprocess.TimeoutExpired:
                text = json.dumps({"case": name, "config": kw, "error": "timeout 60 s"}) + "\n"
            f.write(text)
            f.flush()
            print(text.splitlines()[0], flush=True)
