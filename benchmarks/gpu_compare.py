"""Offline comparison with real GPU figures: recomputes, on this machine, the estimate of every case a GPU run
measured (benchmarks/gpu/<gpu>/validate.json, from `benchmarks.validate_gpu --json-out`) with the current engine, and
prints allocated / reserved / nvidia-smi errors against the stored real figures, with median and max.

Each case also says what its kernel scratch came from: calls found in the GPU's calibration profile (measured) or
costed by the fitted rules (modelled), and whether it is a blind test: "informed the profile" when the profile was
learned from that case's model and configuration, "informed the model: …" when a rule of the CUDA target was written
from that case's per-op measurements (benchmarks/gpu/<gpu>/ops-heldout.jsonl.gz; INFORMED_THE_MODEL), else held out.

    python -m benchmarks.gpu_compare [benchmarks/gpu/h200/validate.json] [--markdown] [--case SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.config.train_config import TrainConfig
from engine.cuda.gpu_profile import profile_for
from engine.planning.estimator import estimate

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "benchmarks" / "gpu" / "h200" / "validate.json"
MIB = 1 << 20

# Validation cases whose per-op measurements a rule of the CUDA target was written from or checked against, and the
# rule: they are no longer blind tests of it.
INFORMED_THE_MODEL = {
    # cuDNN LSTM/GRU reserve and workspace rules (engine.cuda.rnn), fitted to these two and the template, and the
    # order of cuDNN's requests checked against their `_cudnn_rnn` records; their time-major output under batch_first
    # and cross-entropy under CUDA autocast (engine.cuda.target), found in them
    "lstm-lm 2x1024 fp32 adam b32 s128": "cuDNN RNN",
    "gru-lm 3x768 amp-fp16 adamw b16 s256": "cuDNN RNN, autocast cross-entropy",
    # the reduction kernels' staging buffers (engine.cuda.reduce): found in this case's peak op
    "transformer-encoder fp32 adamw b32 s256": "reduction buffers",
    # the fused TransformerEncoder layer's scratch rule (resources/cuda_kernels.json) was written from this case,
    # and its allocation sequence (engine.cuda.fused) checked against its op record and reserved figure
    "transformer-encoder inference fp16 b64 s256": "fused encoder layer",
    "seq2seq nn.Transformer amp-bf16 adamw b16": "autocast cross-entropy",
    # a mask without a unit last-dimension stride takes the math path; estimated with transformers 5.17's mask
    "t5-small (HF) fp32 adamw b8": "strided-mask attention; 5.17's mask",
    # each thread's cuBLAS workspace taken inside its first GEMM (engine.cuda.device_model.first_gemm_position): found
    # while explaining this case's reserved figure (−14.5 % before), placed as the GPT-2 snapshot shows
    "gpt2 amp-bf16 sgd b16 s512": "cuBLAS workspaces at the first GEMM",
}


def _source(model: str) -> str:
    if ":" in model and not Path(model.split(":")[0]).is_absolute():
        return str(ROOT / model)
    return model


RECORDED_TRANSFORMERS = "5.17.0"  # what the H200 run had (benchmarks/gpu/h200/README.md)


@contextmanager
def transformers_as_recorded() -> Iterator[None]:
    """The model code the H200 run executed, where this machine's transformers differs in a way that changes memory.

    transformers 5.17 passed T5's relative-position bias to scaled_dot_product_attention as the permuted view
    compute_bias returns (stride 8 on the last dimension: every fused kernel refuses it, so the GPU ran the math
    path, as its per-op record shows); later versions (5.24 here) make that mask contiguous first, which lets
    PyTorch pick the memory-efficient kernel. Inside this context the mask is built as 5.17 built it."""
    try:
        import transformers
        from transformers.integrations import sdpa_attention
    except ImportError:
        yield
        return
    if transformers.__version__ == RECORDED_TRANSFORMERS:
        yield
        return
    original = sdpa_attention.create_position_bias_mask

    def as_in_5_17(position_bias, attention_mask, is_causal, query, key):  # 5.24's logic, without .contiguous()
        import torch

        low = torch.finfo(key.dtype).min
        if attention_mask is None:
            if not is_causal:
                return position_bias
            q, k = query.shape[2], key.shape[2]
            causal = (torch.arange(q, device=key.device)[:, None] >= torch.arange(k, device=key.device)[None, :])
            return torch.where(causal.view(1, 1, q, k), position_bias, low)
        if attention_mask.dtype == torch.bool:
            return torch.where(attention_mask, position_bias, low)
        return position_bias + attention_mask

    sdpa_attention.create_position_bias_mask = as_in_5_17
    try:
        yield
    finally:
        sdpa_attention.create_position_bias_mask = original


def _pct(est: int, meas: int) -> float:
    return 100.0 * (est - meas) / meas


def compare(path: Path, only: str | None = None) -> list[dict]:
    cases = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for c in cases:
        if only and only not in c["label"]:
            continue
        gpu = c.get("gpu", "H200")
        cfg = TrainConfig(gpu=gpu, **c["config"])
        prof = profile_for(gpu)
        informed = "the profile" if _informed(prof, c) else (
            f"the model: {INFORMED_THE_MODEL[c['label']]}" if c["label"] in INFORMED_THE_MODEL else "")
        t0 = time.perf_counter()
        with transformers_as_recorded():
            est = estimate(_source(c["model"]), cfg)
        g = est.gpu
        assert g is not None and est.replay is not None
        k = est.cuda_kernels
        out.append({
            "label": c["label"],
            "held_out": not informed,
            "informed": informed,
            "allocated": (est.replay.max_memory_allocated, c["meas_allocated"]),
            "reserved": (g.reserved_bytes, c["meas_reserved"]),
            "smi": (g.nvidia_smi_bytes, c["meas_smi"]),
            "band": (g.nvidia_smi_low_bytes, g.nvidia_smi_high_bytes),
            "verdict": g.verdict,
            "kernels": (k.measured_calls, k.modelled_calls) if k is not None else (0, 0),
            "seconds": time.perf_counter() - t0,
            "rounded": bool(c.get("source")),
        })
    return out


def _informed(prof, case: dict) -> bool:
    """Was the GPU profile learned from this case's model and configuration?"""
    if prof is None:
        return False
    want = f"{case['model']} {json.dumps(case['config'], sort_keys=True)}"
    return want in prof.cases


def _fmt_rows(rows: list[dict], markdown: bool) -> list[str]:
    head = ["case", "kernels meas./mod.", "allocated MiB est / real", "err %", "reserved MiB est / real", "err %",
            "nvidia-smi MiB est / real", "err %", "range MiB", "verdict"]
    lines = []
    if markdown:
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["label"] + (" (held out)" if r["held_out"] else f" (informed {r['informed']})"),
                 f"{r['kernels'][0]}/{r['kernels'][1]}"]
        for key in ("allocated", "reserved", "smi"):
            e, m = r[key]
            cells += [f"{e / MIB:,.0f} / {m / MIB:,.0f}", f"{_pct(e, m):+.2f}"]
        cells += [f"{r['band'][0] / MIB:,.0f}–{r['band'][1] / MIB:,.0f}", str(r["verdict"])]
        lines.append("| " + " | ".join(cells) + " |" if markdown else "  ".join(cells))
    return lines


def _summary(rows: list[dict]) -> list[str]:
    lines = []
    for group, sel in (("all", rows), ("held out", [r for r in rows if r["held_out"]])):
        if not sel:
            continue
        for key, name in (("allocated", "allocated"), ("reserved", "reserved"), ("smi", "nvidia-smi")):
            errs = [abs(_pct(*r[key])) for r in sel]
            lines.append(f"- {name} ({group}, {len(sel)} cases): median |error| {statistics.median(errs):.2f} %, "
                         f"max {max(errs):.2f} %")
    inside = sum(1 for r in rows if r["band"][0] <= r["smi"][1] <= r["band"][1])
    lines.append(f"- real nvidia-smi inside the predicted range: {inside} of {len(rows)}")
    bad = [r["label"] for r in rows if r["verdict"] == "does not fit"]
    lines.append(f"- 'does not fit' for a step that ran: {len(bad)}" + (f" ({', '.join(bad)})" if bad else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validate_json", nargs="?", default=str(DEFAULT))
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table (for benchmarks/RESULTS.md)")
    ap.add_argument("--case", default=None, help="only cases whose label contains this")
    a = ap.parse_args(argv)
    path = Path(a.validate_json)
    if not path.is_file():
        print(f"gpu_compare: no such file: {path}", file=sys.stderr)
        return 2
    rows = compare(path, a.case)
    for line in _fmt_rows(rows, a.markdown) + [""] + _summary(rows):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
