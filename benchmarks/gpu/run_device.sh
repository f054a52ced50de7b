#!/usr/bin/env bash
# One prepared run on a lent CUDA machine (from the project's root): the validation table, the LLM workloads and
# the per-op recording of the held-out models. Every part writes into $OUT as it goes, so a time-out keeps the rest.
# Carry bitsandbytes as a wheel in .whl/ (benchmarks/gpu/README.md says how).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv > "$OUT/gpu.txt" 2>&1
timeout 250 python3 -m benchmarks.validate_gpu --no-write --json-out "$OUT/validate.json" --time-limit 235 \
  > "$OUT/validate.log" 2>&1
timeout 150 python3 benchmarks/gpu/measure_llm.py "$OUT/llm.json" --time-limit 140 > "$OUT/llm.log" 2>&1
timeout 100 python3 benchmarks/gpu/record_ops.py . "$OUT/ops-heldout.jsonl.gz" --held-out-only > "$OUT/ops.log" 2>&1
tail -5 "$OUT/validate.log"; tail -3 "$OUT/llm.log"; tail -2 "$OUT/ops.log"
