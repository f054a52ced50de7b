"""The estimate JSON is the same document with typed fields as with the `extra` dict they replaced: documents written
before (tests/data/estimates-before-typed-fields.json, one of each kind of estimate) read into the typed groups and
write back byte for byte, and each group reads what its old keys held."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from engine.core.errors import UserError
from engine.planning.snapshot_fit import config_for
from engine.results.estimate_fields import CudaRun, GenerationFigures, MeasuredPeaks, SnapshotFindings
from engine.results.types import EXTRA_FIELDS, Estimate

DOCS: dict[str, dict] = json.loads(
    (Path(__file__).parent / "data" / "estimates-before-typed-fields.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(DOCS))
def test_a_document_written_before_reads_and_writes_back_byte_for_byte(name):
    doc = DOCS[name]
    again = Estimate.from_json(doc).to_json()
    assert json.dumps(again, indent=2) == json.dumps(doc, indent=2)  # the same keys in the same order
    assert list(again["extra"]) == list(doc["extra"])


def test_each_old_key_lands_in_its_typed_field():
    gen = Estimate.from_json(DOCS["generate, sampling, static cache, H100"])
    g = DOCS["generate, sampling, static cache, H100"]["extra"]
    assert isinstance(gen.generation, GenerationFigures)
    assert gen.generation.kv_cache_bytes == g["generation"]["kv_cache_bytes"] > 0
    assert gen.generation.cache == "static" and gen.generation.decoding == "sampling, top-k 5"
    assert gen.generation.decode_steps_traced == tuple(g["generation"]["decode_steps_traced"])
    assert gen.replay is not None and gen.replay.max_memory_allocated == g["max_memory_allocated"]
    assert gen.replay.cuda_mallocs == g["cuda_mallocs"] and gen.gpu_origin == "named"
    assert gen.cuda_kernels is not None and gen.cuda_kernels.modelled_calls == g["cuda_kernels"]["modelled_calls"]
    assert gen.method == "fake" and gen.sharding is None and gen.snapshot is None and gen.step is None

    fsdp = Estimate.from_json(DOCS["FSDP over 4, A100"])
    s = DOCS["FSDP over 4, A100"]["extra"]
    assert fsdp.sharding is not None and fsdp.sharding.strategy == "fsdp" and fsdp.sharding.world_size == 4
    assert fsdp.sharding.single_gpu_peak_bytes == s["single_gpu_peak_bytes"] > fsdp.peak_bytes
    assert fsdp.sharding.extras_at_peak == s["sharding"]["extras_at_peak"]

    assert Estimate.from_json(DOCS["QLoRA, A100 (modelled parts)"]).modelled == tuple(
        DOCS["QLoRA, A100 (modelled parts)"]["extra"]["modelled"])
    assert len(Estimate.from_json(DOCS["checkpointing, AMP bf16, A100"]).checkpointed) == 8

    step = Estimate.from_json(DOCS["your own step (vramscope.estimate_step)"]).step
    assert step is not None and step.optimizers == ("opt (AdamW)",) and step.training and step.autocast is None

    oom = Estimate.from_json(DOCS["snapshot at an out-of-memory error"])
    o = DOCS["snapshot at an out-of-memory error"]["extra"]
    assert oom.oom is not None and oom.oom.message == o["oom"] and oom.oom.reserved_bytes == o["oom_detail"][
        "reserved_bytes"]
    assert isinstance(oom.snapshot, SnapshotFindings) and oom.snapshot.path == o["snapshot"]["path"]
    assert oom.snapshot.implied_config.to_json() == o["snapshot"]["implied_config"]
    assert oom.snapshot.segments.largest[0].total_size == o["snapshot"]["segments"]["largest"][0]["total_size"]
    assert oom.measured is not None and oom.measured.run is None
    assert oom.measured.max_memory_reserved == o["measured"]["max_memory_reserved"]


def test_an_analytic_estimate_keeps_an_empty_extra():
    doc = {**DOCS["QLoRA, A100 (modelled parts)"], "source": "analytic", "extra": {}}
    est = Estimate.from_json(doc)
    assert est.method is None and est.checkpointed == () and est.replay is None
    assert json.dumps(est.to_json()) == json.dumps(doc)


def test_a_cuda_profile_measurement_writes_the_keys_it_always_had():
    # engine.measure.cuda_profiler's "measured" object, in the order it wrote it as a dict
    old = {"max_memory_allocated": 900, "max_memory_reserved": 1024, "nvml_used_bytes": 1500, "context_bytes": 476,
           "device_name": "NVIDIA H200", "device_total_bytes": 150_000, "driver": "580.159.04",
           "torch": "2.13.0", "cuda": "13.0", "unseen_allocations": 0}
    m = MeasuredPeaks(900, 1024, CudaRun(1500, 476, "NVIDIA H200", 150_000, "580.159.04", "2.13.0", "13.0", 0))
    assert json.dumps(m.to_json()) == json.dumps(old)
    assert MeasuredPeaks.from_json(old) == m
    doc = {**DOCS["CPU profile (method real-cpu)"], "source": "profiler-cuda"}
    doc["extra"] = {**doc["extra"], "measured": old}
    assert json.dumps(Estimate.from_json(doc).to_json()) == json.dumps(doc)


def test_a_generation_saved_before_the_choice_of_program_modelled_the_loop():
    g = {k: v for k, v in DOCS["generate, sampling, static cache, H100"]["extra"]["generation"].items()
         if k not in ("program", "decoding")}
    old = GenerationFigures.from_json(g)
    assert old.program == "loop" and old.describe_program() == "a hand-written prefill-then-decode loop"
    assert replace(old, program="generate", decoding="greedy").describe_program() == "model.generate(), greedy"


def test_the_configuration_of_an_estimate_that_is_no_snapshot_is_a_one_line_error():
    est = Estimate.from_json(DOCS["FSDP over 4, A100"])
    with pytest.raises(UserError, match="not a memory snapshot"):
        config_for(est, None, {})


def test_every_typed_field_is_in_the_json_and_read_back():
    # A field added to Estimate after elapsed_s belongs to "extra" (EXTRA_FIELDS), is written by _extra_json, read
    # by from_json, and has a stored document that sets it (add one to the fixture when adding a field).
    names = [f.name for f in fields(Estimate)]
    assert tuple(names[names.index("elapsed_s") + 1:]) == EXTRA_FIELDS
    # profiler-cuda's measurement (a CudaRun) has no stored document: the test above writes and reads it
    docs = [Estimate.from_json(d) for d in DOCS.values()]
    for name in EXTRA_FIELDS:
        set_in = [e for e in docs if getattr(e, name) not in (None, ())]
        assert set_in, f"no stored document sets Estimate.{name}"
        for e in set_in:
            assert getattr(Estimate.from_json(e.to_json()), name) == getattr(e, name), name
