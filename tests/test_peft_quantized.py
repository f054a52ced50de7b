"""LoRA/QLoRA (real peft), quantized weights (real bitsandbytes) and 8-bit AdamW: the estimate against a real
CPU run of the same step, the storage against bitsandbytes' own modules, and the user's mistakes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.measure.cpu_profiler import measure_cpu
from engine.models.sources import ModelSource
from engine.models.templates.llama import LlamaConfig, LlamaForCausalLM
from engine.planning.estimator import estimate

bnb = pytest.importorskip("bitsandbytes")
pytest.importorskip("peft")

TINY = LlamaConfig(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=344, vocab_size=500)


class TinyLlama(ModelSource):
    name = "tiny-llama"
    kind = "function"

    def build(self, cfg: TrainConfig):
        ids = torch.randint(0, TINY.vocab_size, (cfg.batch_size, 32))
        return LlamaForCausalLM(TINY), {"input_ids": ids, "labels": ids}


def _cfg(**kw) -> TrainConfig:
    kw.setdefault("precision", "bf16")
    kw.setdefault("optimizer", "adamw")
    return TrainConfig(batch_size=2, device="cpu", **kw)


@pytest.mark.parametrize("kw", [
    {"peft": "lora"},
    {"peft": "qlora"},
    {"peft": "qlora", "weights": "fp4", "optimizer": "paged-adamw8bit"},
    {"peft": "lora", "weights": "fp8"},
    {"optimizer": "adamw8bit"},
    {"mode": "inference", "weights": "nf4"},
], ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_estimate_matches_a_real_cpu_run(kw):
    cfg = _cfg(**kw)
    est = estimate(TinyLlama(), cfg)
    _trace, _info, real = measure_cpu(TinyLlama(), cfg)
    assert abs(est.peak_bytes - real) <= max(64, real * 1e-4), (est.peak_bytes, real)


def test_lora_trains_only_the_adapters():
    est = estimate(TinyLlama(), _cfg(peft="lora", lora_rank=4))
    # q_proj (128->128) and v_proj (128->64) in 2 layers, rank 4: A is r x in, B is out x r
    adapters = 2 * (4 * 128 + 128 * 4 + 4 * 128 + 64 * 4)
    assert est.trainable_parameters == adapters
    full = estimate(TinyLlama(), _cfg())
    assert est.parameters == full.parameters + adapters
    b = est.breakdown_at_peak
    # On a bf16 base peft keeps the adapters in float32 (autocast_adapter_dtype), as a model loaded in bf16 has.
    assert b["adapter_weights"] == 4 * adapters
    # AdamW keeps two float32 moments and a float32 step per adapter tensor (8 of them); the base has none.
    last = est.timeline[-1].by_category
    assert last["optimizer_state"] == 2 * 4 * adapters + 8 * 4
    # The frozen base has no gradients: whatever gradients exist are the adapters' (float32).
    assert last.get("gradients", 0) == 0
    assert max(p.by_category.get("gradients", 0) for p in est.timeline) <= 4 * adapters


def test_qlora_base_is_packed_with_its_quantization_state():
    est = estimate(TinyLlama(), _cfg(peft="qlora", lora_rank=4))
    full = estimate(TinyLlama(), _cfg())
    h, i, kv = TINY.hidden, TINY.intermediate, TINY.hidden // TINY.heads * TINY.kv_heads
    linear = TINY.layers * (h * h * 2 + h * kv * 2 + 3 * h * i)
    # genuine bitsandbytes: the bytes of Params4bit plus its QuantState for each layer shape
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)] * TINY.layers
    genuine = 0
    for n, k in shapes:
        q = bnb.nn.Linear4bit(k, n, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
        q = q.to("cpu")
        w = q.weight
        qs = w.quant_state
        genuine += w.numel() * w.element_size() + sum(
            t.numel() * t.element_size() for t in (qs.absmax, qs.code, qs.offset.reshape(1), qs.state2.absmax,
                                                   qs.state2.code))
    assert est.breakdown_at_peak["parameters"] == full.breakdown_at_peak["parameters"] - 2 * linear + genuine
    assert est.parameters == full.parameters + est.trainable_parameters


def test_linear4bit_state_computes_what_bitsandbytes_linear4bit_computes():
    from engine.finetune.quantized import make_linear4bit

    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 64, bias=False)
    ours = make_linear4bit(lin, "nf4", torch.bfloat16)
    theirs = bnb.nn.Linear4bit(128, 64, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
    theirs.weight = bnb.nn.Params4bit(lin.weight.data.clone(), requires_grad=False, quant_type="nf4")
    theirs = theirs.to("cpu")
    theirs.train()
    x = torch.randn(3, 128, dtype=torch.bfloat16, requires_grad=True)
    assert torch.equal(ours(x), theirs(x))
    assert torch.equal(ours.weight.data.view(-1), theirs.weight.data.view(-1))


def test_adapters_stay_float32_on_a_half_base_as_peft_keeps_them():
    import peft

    model = LlamaForCausalLM(TINY).to(torch.bfloat16)  # the usual workflow: load in bf16, then add adapters
    peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    real = {p.dtype for n, p in model.named_parameters() if "lora_" in n}
    from engine.trace.recorded_step import build_real

    ours, _inputs, _info = build_real(TinyLlama(), _cfg(peft="lora", lora_rank=4))
    assert real == {p.dtype for n, p in ours.named_parameters() if "lora_" in n} == {torch.float32}


def test_qlora_on_cuda_says_what_is_modelled():
    est = estimate("gpt2", TrainConfig(peft="qlora", seq_len=64, precision="bf16"))
    assert any("4-bit" in m for m in est.modelled)
    assert est.breakdown_at_peak["adapter_weights"] > 0


def test_unknown_lora_target_names_the_model_linear_layers():
    with pytest.raises(UserError, match="no Linear named 'qkv'.*q_proj"):
        estimate(TinyLlama(), _cfg(peft="lora", lora_targets="qkv"))


def test_all_linear_leaves_the_output_layer_alone():
    from engine.finetune.adapters import resolve_targets

    with torch.device("meta"):
        model = LlamaForCausalLM(TINY)
    assert resolve_targets(model, "all-linear") == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj",
                                                    "up_proj", "v_proj"]
    assert resolve_targets(model, None) == ["q_proj", "v_proj"]


@pytest.mark.parametrize("kw, msg", [
    ({"weights": "nf4"}, "frozen"),
    ({"peft": "dora"}, "unknown PEFT method"),
    ({"weights": "int4", "mode": "inference"}, "unknown weight format"),
    ({"peft": "lora", "lora_rank": 0}, "rank"),
    ({"peft": "lora", "mode": "inference"}, "--mode train"),
])
def test_config_mistakes_are_one_line(kw, msg):
    with pytest.raises(UserError, match=msg):
        TrainConfig(**kw)


def test_cli_mistake_exits_2_without_traceback():
    r = subprocess.run([sys.executable, "main.py", "estimate", "gpt2", "--peft", "lora", "--lora-targets", "q_proj"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "c_attn" in r.stderr + r.stdout


def test_planner_offers_lora_qlora_and_8bit_adamw_with_traced_savings():
    from engine.planning.planner import recommend

    # The CUDA target: bitsandbytes' CUDA step updates in place (its CPU step makes fp32 copies of the states,
    # which outweigh what 8 bits save on a model this small).
    cfg = _cfg(precision="bf16", optimizer="adamw").with_(device="cuda")
    base = estimate(TinyLlama(), cfg)
    recs = {r.title.split(" (")[0]: r for r in recommend(TinyLlama(), cfg, base=base)}
    for title, changed in (("LoRA adapters", {"peft": "lora"}), ("QLoRA", {"peft": "qlora"}),
                           ("8-bit AdamW", {"optimizer": "adamw8bit"})):
        r = recs[title]
        assert not r.analytic and r.config == cfg.with_(**changed)
        assert r.new_peak_bytes == estimate(TinyLlama(), r.config).peak_bytes
        assert r.saves_bytes == base.peak_bytes - r.new_peak_bytes > 0
    assert recs["QLoRA"].saves_bytes > recs["LoRA adapters"].saves_bytes
