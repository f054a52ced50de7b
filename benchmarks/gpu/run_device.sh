#!/usr/bin/env bash
# One prepared run on a lent CUDA machine (from the project's root), most wanted first: `vramscope calibrate` and the
# live kernel measurement against real steps (never run on a GPU yet), the allocator histories of the plain CNN
# cases (the one over the reserved target), the per-op recording of the held-out models with each kernel's
# requests, then the validation table and the LLM workloads. Every part writes into $OUT as it goes, so a time-out
# keeps the rest; about 560 s in all.
# Carry bitsandbytes as a wheel in .whl/ (README.md here says how).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv > "$OUT/gpu.txt" 2>&1
timeout 170 python3 -m benchmarks.gpu.calibrate_check "$OUT/calibrate" > "$OUT/calibrate.log" 2>&1
timeout 60 python3 -m benchmarks.validate_gpu --only "plain cnn" --snapshots "$OUT/snapshots" --no-write \
  --json-out "$OUT/validate-snapshots.json" --time-limit 55 > "$OUT/validate-snapshots.log" 2>&1
timeout 100 python3 benchmarks/gpu/record_ops.py . "$OUT/ops-heldout.jsonl.gz" --held-out-only > "$OUT/ops.log" 2>&1
timeout 150 python3 -m benchmarks.validate_gpu --no-write --json-out "$OUT/validate.json" --time-limit 140 \
  > "$OUT/validate.log" 2>&1
timeout 80 python3 benchmarks/gpu/measure_llm.py "$OUT/llm.json" --time-limit 70 > "$OUT/llm.log" 2>&1
tail -8 "$OUT/calibrate.log"; tail -3 "$OUT/validate-snapshots.log"; tail -2 "$OUT/ops.log"; tail -5 "$OUT/validate.log"
tail -3 "$OUT/llm.log"
