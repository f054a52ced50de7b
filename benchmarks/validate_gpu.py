"""GPU validation: estimate against the real step on this machine's NVIDIA GPU.

For a zoo of CNN, ViT, BERT, GPT-2 and a LLaMA-shaped decoder (fp32, AMP bf16/fp16, Adam/AdamW/SGD, with and
without checkpointing, several batch sizes) it compares the estimate with torch.cuda.max_memory_allocated(),
torch.cuda.max_memory_reserved() and the NVML "used" memory, and appends the table (GPU, driver, torch) to
benchmarks/RESULTS.md. Each case runs in a fresh process so the allocator and the context start clean.

    python -m benchmarks.validate_gpu [--only SUBSTRING] [--no-write] [--time-limit SECONDS] [--snapshots DIR]

With --snapshots, each real step is recorded with `vramscope.record` (the allocator's every request and free, with
C++ frames) into DIR/<label>.pickle.gz: what explains a reserved figure the per-op recording cannot (the order and
size of each kernel's own requests). Recording does not change the figures; it makes each case slower.

Without an NVIDIA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).with_name("RESULTS.md")
HERE = Path(__file__).resolve()
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (label, model, config) — model is a template name or this file's LLaMA-shaped decoder
CASES = [
    ("resnet50 fp32 adam b32", "resnet50", dict(batch_size=32, optimizer="adam")),
    ("resnet50 amp-fp16 sgd-m b64", "resnet50", dict(batch_size=64, optimizer="sgd-momentum", precision="amp-fp16")),
    ("resnet50 amp-bf16 adamw b32 ckpt", "resnet50",
     dict(batch_size=32, optimizer="adamw", precision="amp-bf16", checkpointing=True)),
    ("resnet50 inference amp-fp16 b128", "resnet50", dict(batch_size=128, mode="inference", precision="amp-fp16")),
    ("vit-b16 fp32 adamw b16", "vit-b16", dict(batch_size=16, optimizer="adamw")),
    ("vit-b16 amp-bf16 adamw b32 ckpt", "vit-b16",
     dict(batch_size=32, optimizer="adamw", precision="amp-bf16", checkpointing=True)),
    ("bert-base fp32 adam b16 s128", "bert-base", dict(batch_size=16, seq_len=128, optimizer="adam")),
    ("bert-base amp-fp16 adamw b32 s256", "bert-base",
     dict(batch_size=32, seq_len=256, optimizer="adamw", precision="amp-fp16")),
    ("bert-base fp32 sgd b32 s128", "bert-base", dict(batch_size=32, seq_len=128, optimizer="sgd")),
    ("gpt2 fp32 adamw b8 s512", "gpt2", dict(batch_size=8, seq_len=512, optimizer="adamw")),
    ("gpt2 amp-bf16 adamw b8 s1024 ckpt", "gpt2",
     dict(batch_size=8, seq_len=1024, optimizer="adamw", precision="amp-bf16", checkpointing=True)),
    ("gpt2 amp-bf16 sgd b16 s512", "gpt2", dict(batch_size=16, seq_len=512, optimizer="sgd", precision="amp-bf16")),
    ("gpt2 inference bf16 b16 s1024", "gpt2", dict(batch_size=16, seq_len=1024, mode="inference", precision="bf16")),
    ("llama-small fp32 adamw b4 s512", f"{HERE}:llama_small_512", dict(batch_size=4, optimizer="adamw")),
    ("llama-small amp-bf16 adamw b8 s1024", f"{HERE}:llama_small_1024",
     dict(batch_size=8, optimizer="adamw", precision="amp-bf16")),
    ("llama-small amp-bf16 adamw b8 s1024 ckpt", f"{HERE}:llama_small_1024",
     dict(batch_size=8, optimizer="adamw", precision="amp-bf16", checkpointing=True)),
]

# Held out: architectures the kernel model was not written against (benchmarks/gpu_models.py), plus the U-Net and
# VGG-16 templates at settings other than those the per-op recording used.
_HELD = str(Path(__file__).with_name("gpu_models.py"))
HELD_OUT = [
    ("lstm-lm 2x1024 fp32 adam b32 s128", f"{_HELD}:lstm_lm", dict(batch_size=32, optimizer="adam")),
    ("gru-lm 3x768 amp-fp16 adamw b16 s256", f"{_HELD}:gru_lm",
     dict(batch_size=16, optimizer="adamw", precision="amp-fp16")),
    ("bilstm tagger 2x192 fp32 adam b16 s80", f"{_HELD}:bilstm_tagger", dict(batch_size=16, optimizer="adam")),
    ("plain cnn (no BN) fp32 adam b64", f"{_HELD}:plain_cnn", dict(batch_size=64, optimizer="adam")),
    ("plain cnn (no BN) amp-bf16 sgd-m b128", f"{_HELD}:plain_cnn",
     dict(batch_size=128, optimizer="sgd-momentum", precision="amp-bf16")),
    ("transformer-encoder fp32 adamw b32 s256", f"{_HELD}:transformer_encoder", dict(batch_size=32, optimizer="adamw")),
    ("transformer-encoder inference fp16 b64 s256", f"{_HELD}:transformer_encoder",
     dict(batch_size=64, mode="inference", precision="fp16")),
    ("seq2seq nn.Transformer amp-bf16 adamw b16", f"{_HELD}:seq2seq",
     dict(batch_size=16, optimizer="adamw", precision="amp-bf16")),
    ("t5-small (HF) fp32 adamw b8", f"{_HELD}:t5_small", dict(batch_size=8, optimizer="adamw")),
    ("unet amp-bf16 adamw b8", "unet", dict(batch_size=8, optimizer="adamw", precision="amp-bf16")),
    ("vgg16 fp32 sgd b32", "vgg16", dict(batch_size=32, optimizer="sgd")),
]
CASES = CASES + HELD_OUT
HELD_LABELS = {label for label, _m, _k in HELD_OUT}


# ------------------------------------------------------------------------------ a LLaMA-shaped decoder, small


def _llama(batch_size: int, seq: int, dim: int = 1024, layers: int = 8, heads: int = 16, kv_heads: int = 4,
           hidden: int = 2816, vocab: int = 32000):
    import torch
    from torch import nn
    from torch.nn import functional as F

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def rotate(x, cos, sin):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.hd = dim // heads
            self.attn_norm = RMSNorm(dim)
            self.q = nn.Linear(dim, dim, bias=False)
            self.k = nn.Linear(dim, kv_heads * self.hd, bias=False)
            self.v = nn.Linear(dim, kv_heads * self.hd, bias=False)
            self.o = nn.Linear(dim, dim, bias=False)
            self.mlp_norm = RMSNorm(dim)
            self.gate = nn.Linear(dim, hidden, bias=False)
            self.up = nn.Linear(dim, hidden, bias=False)
            self.down = nn.Linear(hidden, dim, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            h = self.attn_norm(x)
            q = self.q(h).view(b, t, heads, self.hd).transpose(1, 2)
            k = self.k(h).view(b, t, kv_heads, self.hd).transpose(1, 2)
            v = self.v(h).view(b, t, kv_heads, self.hd).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, dim))
            h = self.mlp_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.layers = nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            inv = 1.0 / (10000 ** (torch.arange(0, dim // heads, 2).float() / (dim // heads)))
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, ids):
            t = ids.shape[1]
            freqs = torch.outer(torch.arange(t, device=ids.device, dtype=torch.float32), self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos()[None, None].to(self.embed.weight.dtype), emb.sin()[None, None].to(
                self.embed.weight.dtype)
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.head(self.norm(x))

    return Decoder(), torch.randint(0, vocab, (batch_size, seq))


def llama_small_512(batch_size):
    """LLaMA-shaped decoder (RMSNorm, rotary, SwiGLU, grouped KV heads), 8 layers of width 1024, sequence 512."""
    return _llama(batch_size, 512)


def llama_small_1024(batch_size):
    """The same decoder at sequence 1024."""
    return _llama(batch_size, 1024)


# ------------------------------------------------------------------------------ one case, in its own process


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in label).strip("-")


def _run_case(index: int, snapshot: str | None = None) -> dict:
    import torch

    from engine.config.gpus import find_gpu
    from engine.config.train_config import TrainConfig
    from engine.core.tensor_tree import map_tensors
    from engine.cuda.device_model import device_detail
    from engine.cuda.nvml_used import nvml_used_bytes
    from engine.models.sources import resolve_source
    from engine.trace.checkpointing import apply_checkpointing
    from engine.trace.step import DTYPES, cast_inputs, run_steps
    from engine.trace.summary import summarise
    from engine.trace.tracer import trace_model
    from vramscope import record

    label, model_ref, kw = CASES[index]
    name = torch.cuda.get_device_name(0)
    props = torch.cuda.get_device_properties(0)
    try:
        gpu = find_gpu(name).name
    except Exception:  # noqa: BLE001 - a GPU the catalogue does not know: no fit verdict, its cc still counts
        gpu = None
    cfg = TrainConfig(device="cuda", gpu=gpu, **kw)
    source = resolve_source(model_ref)
    # the estimate first: on the CPU, before this process creates a CUDA context (so the table is used)
    t0 = time.perf_counter()
    trace, info = trace_model(source, cfg)
    est = summarise(trace, info, cfg)
    detail = device_detail(trace, est, cfg, compute_capability=(props.major, props.minor))
    t_est = time.perf_counter() - t0

    model, inputs = source.build(cfg)
    if cfg.checkpointing and cfg.training:
        apply_checkpointing(model)
    if cfg.precision in ("fp16", "bf16"):
        model.to(DTYPES[cfg.precision])
        inputs = cast_inputs(inputs, DTYPES[cfg.precision])

    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    model.to("cuda")
    inputs = map_tensors(inputs, lambda t: t.to("cuda"))
    t0 = time.perf_counter()
    oom = False
    try:
        # AMP as users run it: run_steps autocasts the forward on the model's device (CUDA here), not the backward
        with record(snapshot) if snapshot else nullcontext():
            run_steps(model, inputs, cfg, lambda s, p: None)
            torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        oom = True
    t_real = time.perf_counter() - t0
    used, driver = nvml_used_bytes(torch.cuda.current_device())
    reserved_now = torch.cuda.memory_reserved()
    g = detail.figures
    return {
        "label": label,
        "oom": oom,
        "est_peak": est.peak_bytes,
        "est_allocated": detail.max_memory_allocated,
        "est_reserved": g.reserved_bytes,
        "est_smi": g.nvidia_smi_bytes,
        "est_context": g.cuda_context_bytes,
        "meas_allocated": torch.cuda.max_memory_allocated(),
        "meas_reserved": torch.cuda.max_memory_reserved(),
        "meas_smi": used,
        "meas_context": (used - reserved_now) if used is not None else None,
        "gpu": name,
        "cc": f"{props.major}.{props.minor}",
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "t_est": t_est,
        "t_real": t_real,
    }


# ------------------------------------------------------------------------------ the whole run


def _pct(est, meas):
    return None if not meas else 100.0 * (est - meas) / meas


def _mib(n):
    return "n/a" if n is None else f"{n / 2**20:,.0f}"


def _table(rows: list[dict]) -> list[str]:
    lines = [
        "| case | est. allocated MiB | max_memory_allocated MiB | err % | est. reserved MiB | max_memory_reserved MiB "
        "| err % | est. nvidia-smi MiB | NVML used MiB | err % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['label']} | failed: {r['error']} |||||||||")
            continue
        if r["oom"]:
            lines.append(f"| {r['label']} | {_mib(r['est_allocated'])} | out of memory |||||||| ")
            continue
        cells = []
        for e, m in (("est_allocated", "meas_allocated"), ("est_reserved", "meas_reserved"), ("est_smi", "meas_smi")):
            err = _pct(r[e], r[m])
            cells += [_mib(r[e]), _mib(r[m]), "n/a" if err is None else f"{err:+.2f}"]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return lines


def _summary(rows: list[dict]) -> list[str]:
    ok = [r for r in rows if not r.get("error") and not r["oom"]]
    out = []
    for name, e, m, target in (("allocated", "est_allocated", "meas_allocated", 3.0),
                               ("reserved", "est_reserved", "meas_reserved", 5.0),
                               ("nvidia-smi", "est_smi", "meas_smi", 5.0)):
        errs = [abs(_pct(r[e], r[m])) for r in ok if r[m]]
        if errs:
            mae = statistics.mean(errs)
            out.append(f"- {name}: mean |error| {mae:.2f} %, median {statistics.median(errs):.2f} % over "
                       f"{len(errs)} cases (target ≤ {target:.0f} %: {'met' if mae <= target else 'NOT met'}), "
                       f"max {max(errs):.2f} %")
            held = [abs(_pct(r[e], r[m])) for r in ok if r[m] and r["label"] in HELD_LABELS]
            if held:
                out.append(f"  - held-out cases only: median {statistics.median(held):.2f} %, "
                           f"max {max(held):.2f} % over {len(held)}")
    ctx = [r["meas_context"] for r in ok if r.get("meas_context")]
    if ctx:
        out.append(f"- measured context (NVML used − reserved): median {statistics.median(ctx) / 2**20:.0f} MiB; "
                   f"table value {ok[0]['est_context'] / 2**20:.0f} MiB")
    return out


def _append_results(text: str) -> None:
    old = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
    new = old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    fd, tmp = tempfile.mkstemp(dir=RESULTS.parent, prefix=".RESULTS.", suffix=".md")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(tmp, RESULTS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run the cases whose label contains this")
    ap.add_argument("--no-write", action="store_true", help="do not append to benchmarks/RESULTS.md")
    ap.add_argument("--time-limit", type=float, default=450.0, help="seconds; cases left then are skipped")
    ap.add_argument("--json-out", default=None, help="also write every case's estimated and measured figures here")
    ap.add_argument("--snapshots", default=None, metavar="DIR",
                    help="record each real step's allocator history into DIR/<label>.pickle.gz")
    ap.add_argument("--case", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--snapshot", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("no GPU: PyTorch is not installed here; nothing to validate")
        return 0
    if not torch.cuda.is_available():
        print(f"no GPU: torch {torch.__version__} sees no CUDA device on this machine "
              f"(built with CUDA {torch.version.cuda or 'none'}); nothing to validate. "
              "Run this on a machine with an NVIDIA GPU.")
        return 0
    if args.case is not None:
        print(json.dumps(_run_case(args.case, args.snapshot)))
        return 0

    if args.snapshots:
        Path(args.snapshots).mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    picked = [i for i, (label, _m, _k) in enumerate(CASES) if not args.only or args.only in label]
    picked.sort(key=lambda i: CASES[i][0] not in HELD_LABELS)  # held-out first: they are what a time limit must keep
    rows, skipped = [], []
    for i in picked:
        label = CASES[i][0]
        left = args.time_limit - (time.perf_counter() - t_start)
        if left < 20:
            skipped.append(label)
            continue
        try:
            snap = ["--snapshot", str(Path(args.snapshots) / f"{_slug(label)}.pickle.gz")] if args.snapshots else []
            p = subprocess.run([sys.executable, str(HERE), "--case", str(i), *snap], capture_output=True, text=True,
                               timeout=max(20.0, left), cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
            line = (p.stdout.strip().splitlines() or [""])[-1]
            row = json.loads(line) if p.returncode == 0 and line.startswith("{") else {
                "label": label, "error": (p.stderr.strip().splitlines() or ["no output"])[-1][:120]}
        except subprocess.TimeoutExpired:
            row = {"label": label, "error": "time limit"}
        row["config"] = CASES[i][2]
        row["model"] = CASES[i][1].replace(str(ROOT) + "/", "")
        row["held_out"] = label in HELD_LABELS
        rows.append(row)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
        if row.get("error"):
            print(f"{label:<44} FAILED {row['error']}", flush=True)
        elif row["oom"]:
            print(f"{label:<44} out of memory (estimated nvidia-smi {_mib(row['est_smi'])} MiB)", flush=True)
        else:
            print(f"{label:<44} allocated {_mib(row['est_allocated']):>8} vs {_mib(row['meas_allocated']):>8} MiB"
                  f"  reserved {_mib(row['est_reserved']):>8} vs {_mib(row['meas_reserved']):>8}"
                  f"  smi {_mib(row['est_smi']):>8} vs {_mib(row['meas_smi']):>8}", flush=True)
    good = next((r for r in rows if not r.get("error")), None)
    head = [
        f"## GPU validation, {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        (f"GPU {good['gpu']} (compute capability {good['cc']}), driver {good['driver']}, torch {good['torch']}, "
         f"CUDA {good['cuda']}.") if good else "No case ran.",
        "Estimate (fake-tensor trace + allocator model + context table) against the real step in a fresh process.",
        "",
    ]
    text = "\n".join(head + _table(rows) + [""] + _summary(rows)
                     + ([f"- skipped for time: {', '.join(skipped)}"] if skipped else [])
                     + [f"- wall time {time.perf_counter() - t_start:.0f} s"])
    print()
    print(text)
    if not args.no_write and rows:
        _append_results(text)
        print(f"\nappended to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
