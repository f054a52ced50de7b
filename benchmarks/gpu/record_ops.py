"""Copied from the shared GPU measurements (shared/gpu/record_ops.py) so it travels with the project; this copy adds
the held-out models of benchmarks/gpu_models.py. On a CUDA machine: the real two steps of the project's own templates, each aten op seen by a dispatch mode that
records its inputs, its output bytes, torch.cuda.memory_allocated() before and after it and the peak inside it
(so cuDNN/cuBLAS workspaces, RNN reserves and caches show), plus a head line per case with the run's figures. The
recorder is engine.measure.calibrate.record_steps: each kernel op's row (engine.cuda.gpu_profile.KERNEL_OPS) also has
"requests", every allocation it made in order (0 for an output, else the bytes of a scratch request it freed before
returning), read from the caching allocator's own trace (engine.cuda.kernel_requests); the head line counts the kernel
calls and those whose requests were found.
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
    ("benchmarks/gpu_models.py:bilstm_tagger", dict(batch_size=16, optimizer="adam")),
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
from engine.measure.calibrate import record_steps
from engine.config.train_config import TrainConfig
from engine.cuda.gpu_profile import KERNEL_OPS, short_op
from engine.models.sources import resolve_source
name, kw = sys.argv[2], json.loads(sys.argv[3])
cfg = TrainConfig(device="cuda", **kw)
model, inputs = resolve_source(name).build(cfg)
torch.cuda.init()
t0 = time.time()
rows = record_steps(model, inputs, cfg, "cuda:0")  # engine.measure.calibrate's recorder: the same rows, plus "requests"
kernel_rows = [r for r in rows if short_op(r["op"]) in KERNEL_OPS]
head = {"case": name, "config": kw, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(), "ops": len(rows), "peak_allocated": max(r["peak"] for r in rows),
        "reserved_now": torch.cuda.memory_reserved(), "seconds": round(time.time() - t0, 1),
        "kernel_calls": len(kernel_rows), "kernel_calls_with_requests": sum("requests" in r for r in kernel_rows)}
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
