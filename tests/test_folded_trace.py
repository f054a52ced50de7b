"""Depth-independent tracing (engine.trace.folded_trace): a folded trace is the full trace, event for event and figure
for figure, on the templates and Hugging Face models; blocks that differ, and models the cut stack breaks, fall back to
the full trace and say why (extra.trace_fold)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch
from torch import nn

import main as entry
from benchmarks.fold_identity import canonical_events, comparable_figures
from engine.config.train_config import TrainConfig
from engine.models.hf_source import HFConfigSource
from engine.models.source import ModelSource
from engine.models.templates import TEMPLATES
from engine.models.templates.inputs import token_ids
from engine.models.templates.llama import LlamaConfig, LlamaForCausalLM, LlamaMLP
from engine.planning.estimator import estimate_of_trace
from engine.results.types import Estimate
from engine.trace.fold_plan import MIN_BLOCKS, RUNGS, FoldPlan
from engine.trace.tracer import trace_model

LAYERS = 8
TINY_LLAMA: dict[str, Any] = dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                  num_hidden_layers=LAYERS)
TINY_GPT2: dict[str, Any] = dict(model_type="gpt2", vocab_size=512, n_embd=64, n_layer=LAYERS, n_head=4,
                                 n_positions=128, bos_token_id=0, eos_token_id=0)
MISTRAL_SW: dict[str, Any] = dict(model_type="mistral", vocab_size=288, hidden_size=64, intermediate_size=112,
                                  num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                                  sliding_window=6, num_hidden_layers=LAYERS)
QWEN3_SW: dict[str, Any] = dict(model_type="qwen3", vocab_size=320, hidden_size=48, intermediate_size=96,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                                use_sliding_window=True, sliding_window=8, max_window_layers=3,
                                num_hidden_layers=LAYERS)
GEMMA2: dict[str, Any] = dict(model_type="gemma2", vocab_size=512, hidden_size=64, intermediate_size=128,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                              num_hidden_layers=LAYERS)
MIXTRAL: dict[str, Any] = dict(model_type="mixtral", vocab_size=512, hidden_size=64, intermediate_size=128,
                               num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                               num_experts_per_tok=2, num_hidden_layers=LAYERS)


class _Fn(ModelSource):
    kind = "function"

    def __init__(self, name: str, fn: Any) -> None:
        self.name, self.fn = name, fn

    def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
        return self.fn(cfg)  # type: ignore[no-any-return]


def _llama(layers: int = LAYERS, kv_heads: int = 2, tweak: Any = None) -> _Fn:
    """The llama-7b/13b/70b templates' code (LlamaForCausalLM) at a small size; GQA as in 70B."""
    c = LlamaConfig(hidden=64, layers=layers, heads=4, kv_heads=kv_heads, intermediate=128, vocab_size=256)

    def build(cfg: TrainConfig) -> tuple[nn.Module, Any]:
        ids = token_ids(cfg.batch_size, 16, c.vocab_size)
        model = LlamaForCausalLM(c)
        if tweak is not None:
            tweak(model)
        return model, {"input_ids": ids, "labels": ids}

    return _Fn(f"llama-{layers}", build)


def _both(source: ModelSource | str, cfg: TrainConfig) -> tuple[dict[str, Any], Estimate, Estimate]:
    """(the folded trace's fold field, folded estimate, full estimate), after checking the events are the same."""
    folded, finfo = trace_model(source, cfg)
    full, info = trace_model(source, cfg.with_(full_trace=True))
    assert info.fold is not None and info.fold.to_json() == {"folded": False, "reason": "the full trace was asked for"}
    assert canonical_events(folded, finfo.storage_owner) == canonical_events(full, info.storage_owner)
    a, b = estimate_of_trace(folded, finfo, cfg), estimate_of_trace(full, info, cfg)
    assert comparable_figures(a) == comparable_figures(b)
    assert finfo.fold is not None
    return finfo.fold.to_json(), a, b


FIRST_RUNG = sum(RUNGS[0]) + 2  # blocks traced: the head, the two middle ones, the tail
SECOND_RUNG = sum(RUNGS[1]) + 2


def _assert_folded(fold: dict[str, Any], blocks: int, traced: int = FIRST_RUNG) -> None:
    assert fold == {"folded": True, "stack": fold["stack"], "blocks": blocks, "traced_blocks": traced}


# -- templates ----------------------------------------------------------------------------------------------------

# Templates that fold, small inputs; gpt2-medium, bert-large, resnet152 and llama-13b/70b run the same code as
# gpt2, bert-base, resnet101 and the small llama below (their traces take tens of seconds here).
# (inputs, blocks, blocks traced): BERT's and ResNet's last block is odd in backward (the block before it refers to
# what it did not allocate), so their two middle blocks differ at the first rung and they fold at the second.
FOLDING = {
    "gpt2": (dict(seq_len=16), 12, FIRST_RUNG),
    "bert-base": (dict(seq_len=16), 12, SECOND_RUNG),
    "vit-b16": (dict(), 12, FIRST_RUNG),
    "resnet101": (dict(image_size=32, batch_size=2), 23, SECOND_RUNG),
}


@pytest.mark.parametrize("name", sorted(FOLDING))
def test_a_template_folds_to_the_full_trace(name):
    kw, blocks, traced = FOLDING[name]
    fold, est, _ = _both(name, TrainConfig(**{"batch_size": 1, **kw}, optimizer="adamw", gpu="A100 80GB"))
    _assert_folded(fold, blocks, traced)
    assert est.gpu is not None and est.gpu.reserved_bytes > 0  # the allocator's replay is compared too


def test_a_stack_the_first_rung_declines_folds_at_the_second_and_starts_there_next(monkeypatch):
    """BERT's stack: the first rung's two middle blocks differ (its last block is odd in backward), the second rung
    folds it; the next trace of the same stack starts at the second rung, not at the one that declined it."""
    from engine.trace import tracer

    rungs: list[int] = []
    real = tracer._record

    def record(*a: Any, **kw: Any) -> str | None:
        fold = a[-1]
        rungs.append(fold.rung if isinstance(fold, FoldPlan) else -1)
        return real(*a, **kw)

    monkeypatch.setattr(tracer, "_record", record)
    cfg = TrainConfig(batch_size=1, seq_len=16, optimizer="adamw", device="cpu")
    fold, _, _ = _both("bert-base", cfg)  # (its full trace: rung -1)
    _assert_folded(fold, 12, SECOND_RUNG)
    assert rungs == [0, 1, -1]
    rungs.clear()
    _trace, info = trace_model("bert-base", cfg)
    assert rungs == [1] and info.fold is not None and info.fold.traced_blocks == SECOND_RUNG
    rungs.clear()
    tracer.forget_fold_rungs()
    trace_model("bert-base", cfg)
    assert rungs == [0, 1]


@pytest.mark.parametrize("cfg", [
    TrainConfig(batch_size=2, optimizer="adamw", precision="amp-bf16", gpu="A100 80GB"),
    TrainConfig(batch_size=2, optimizer="sgd-momentum", checkpointing=True, device="cpu"),
    TrainConfig(batch_size=2, optimizer="adam", grad_accum=3, device="cpu"),
    TrainConfig(batch_size=2, mode="inference", optimizer="none", precision="fp16", gpu="H100"),
], ids=["amp-cuda", "checkpointing-cpu", "accumulation", "inference"])
def test_the_llama_templates_code_folds_to_the_full_trace(cfg):
    fold, _, _ = _both(_llama(kv_heads=1), cfg)
    _assert_folded(fold, LAYERS)


def test_templates_that_cannot_fold_say_why():
    for name in TEMPLATES:
        if name in ("resnet18", "resnet34", "resnet50", "unet", "lstm-lm", "mobilenet_v2", "vgg16"):
            _trace, info = trace_model(name, TrainConfig(batch_size=2, image_size=32, seq_len=8, optimizer="sgd",
                                                         device="cpu"))
            assert info.fold is not None and info.fold.folded is False and info.fold.reason, name


# -- Hugging Face models -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, cfg", [
    (TINY_LLAMA, TrainConfig(batch_size=2, seq_len=16, optimizer="adamw", device="cpu")),
    (TINY_LLAMA, TrainConfig(batch_size=2, seq_len=16, mode="inference", optimizer="none")),  # a KV cache freed
    (TINY_GPT2, TrainConfig(batch_size=2, seq_len=16, optimizer="adamw", precision="amp-bf16", gpu="A100 80GB")),
    (MISTRAL_SW, TrainConfig(batch_size=2, seq_len=16, optimizer="adamw", device="cpu")),  # every layer sliding
    (MIXTRAL, TrainConfig(batch_size=2, seq_len=16, optimizer="adamw", device="cpu")),  # grouped_mm experts
    ({**MIXTRAL, "experts_implementation": "eager"}, TrainConfig(batch_size=2, seq_len=16, device="cpu")),
    (TINY_LLAMA, TrainConfig(batch_size=2, seq_len=16, peft="lora", precision="bf16", gpu="A100 80GB")),
    # checkpointed as transformers does it (its layers train without the KV cache: engine.trace.checkpointing)
    (TINY_LLAMA, TrainConfig(batch_size=2, seq_len=16, checkpointing=True, device="cpu")),
    (MISTRAL_SW, TrainConfig(batch_size=2, seq_len=16, checkpointing=True, gpu="A100 80GB")),
], ids=["llama", "llama-inference", "gpt2-amp", "mistral-sliding", "mixtral-grouped-mm", "mixtral-eager", "lora",
        "llama-checkpointing", "mistral-sliding-checkpointing"])
def test_a_hugging_face_model_folds_to_the_full_trace(fields, cfg):
    fold, _, _ = _both(HFConfigSource(dict(fields), str(fields["model_type"]), "test"), cfg)
    _assert_folded(fold, LAYERS)


@pytest.mark.parametrize("name, blocks", [("llama-3.2-1b", 16), ("qwen1.5-moe-a2.7b", 24)])
def test_a_catalogue_model_folds_to_the_full_trace(name, blocks):
    fold, _, _ = _both(name, TrainConfig(batch_size=1, seq_len=16, optimizer="adamw", gpu="H100"))
    _assert_folded(fold, blocks)


def test_qlora_folds_to_the_full_trace():
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    cfg = TrainConfig(batch_size=2, seq_len=16, peft="qlora", precision="bf16", optimizer="paged-adamw8bit",
                      gpu="A100 80GB")
    fold, _, _ = _both(HFConfigSource(dict(TINY_LLAMA), "llama", "test"), cfg)
    _assert_folded(fold, LAYERS)


@pytest.mark.parametrize("fields, cfg, words", [
    (QWEN3_SW, TrainConfig(batch_size=2, seq_len=16, device="cpu"), "layer_type"),  # sliding from layer 3 on
    # sliding and full interleaved, too few layers to fold by pairs (10 or more)
    (GEMMA2, TrainConfig(batch_size=2, seq_len=16, device="cpu"), "the blocks repeat every 2, but 8 blocks"),
], ids=["qwen3-sliding-from-layer-3", "gemma2-too-short-for-its-period"])
def test_blocks_that_differ_fall_back_to_the_full_trace(fields, cfg, words):
    fold, _, _ = _both(HFConfigSource(dict(fields), str(fields["model_type"]), "test"), cfg)
    assert fold["folded"] is False and words in fold["reason"] and "layer_type" in fold["reason"], fold


# -- stacks whose blocks repeat with a period (folded by units of `period` blocks: engine.trace.fold_plan) ------------

GEMMA2_16 = {**GEMMA2, "num_hidden_layers": 16}


@pytest.mark.parametrize("cfg, traced", [
    (TrainConfig(batch_size=2, seq_len=16, optimizer="adamw", device="cpu"), 8),
    (TrainConfig(batch_size=2, seq_len=16, optimizer="adamw", gpu="A100 80GB"), 8),
    (TrainConfig(batch_size=2, seq_len=16, optimizer="adamw", precision="amp-bf16", gpu="A100 80GB"), 8),
    (TrainConfig(batch_size=2, seq_len=16, optimizer="adamw", checkpointing=True, device="cpu"), 8),
    (TrainConfig(batch_size=2, seq_len=16, peft="lora", precision="bf16", gpu="A100 80GB"), 8),
], ids=["adamw-cpu", "adamw-cuda", "adamw-amp-cuda", "checkpointing-cpu", "lora-cuda"])
def test_gemma2s_alternating_layers_fold_by_pairs(cfg, traced):
    """gemma-2's layers alternate sliding and full attention (self_attn.layer_type): folded by pairs of layers, four
    pairs traced of eight (its KV cache's sliding layers each hold a tensor of their own, freed along the layers)."""
    fold, _, _ = _both(HFConfigSource(dict(GEMMA2_16), "gemma2", "test"), cfg)
    assert fold == {"folded": True, "stack": "model.layers", "blocks": 16, "traced_blocks": traced, "period": 2}


QWEN2_MOE_EVERY_OTHER: dict[str, Any] = dict(
    model_type="qwen2_moe", vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    shared_expert_intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
    num_experts_per_tok=2, decoder_sparse_step=2, num_hidden_layers=16)  # MoE layers interleaved with dense ones
GEMMA3: dict[str, Any] = dict(model_type="gemma3_text", vocab_size=512, hidden_size=64, intermediate_size=128,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                              num_hidden_layers=32)  # five sliding layers, then a full one; 2 past whole periods


@pytest.mark.parametrize("fields, period, traced", [
    (QWEN2_MOE_EVERY_OTHER, 2, 8),
    (GEMMA3, 6, 26),
], ids=["qwen2-moe-every-other-layer", "gemma3-five-sliding-one-full"])
def test_other_periodic_stacks_fold_by_their_period(fields, period, traced):
    fold, _, _ = _both(HFConfigSource(dict(fields), str(fields["model_type"]), "test"),
                       TrainConfig(batch_size=2, seq_len=16, optimizer="adamw", device="cpu"))
    assert fold == {"folded": True, "stack": "model.layers", "blocks": fields["num_hidden_layers"],
                    "traced_blocks": traced, "period": period}


def _mlp_widths(widths: tuple[int, ...], odd: int | None = None) -> Any:
    """A tweak of _llama's model: layer i's MLP `widths[i % len(widths)]` wide (layer `odd`'s 24): its layers repeat
    with that period."""

    def tweak(model: nn.Module) -> None:
        for i, layer in enumerate(model.layers):
            layer.mlp = LlamaMLP(dataclasses.replace(model.config, intermediate=24 if i == odd else
                                                     widths[i % len(widths)]))

    return tweak


@pytest.mark.parametrize("cfg", [
    TrainConfig(batch_size=2, optimizer="adamw", device="cpu"),
    TrainConfig(batch_size=2, optimizer="sgd-momentum", gpu="A100 80GB"),
], ids=["adamw-cpu", "momentum-cuda"])
def test_a_stack_of_period_three_folds(cfg):
    """18 layers of period 3: six units of three layers, four traced."""
    fold, _, _ = _both(_llama(layers=18, tweak=_mlp_widths((40, 48, 56))), cfg)
    assert fold == {"folded": True, "stack": "layers", "blocks": 18, "traced_blocks": 12, "period": 3}


@pytest.mark.parametrize("cfg", [
    TrainConfig(batch_size=2, optimizer="adamw", device="cpu"),
    TrainConfig(batch_size=2, optimizer="sgd-momentum", gpu="A100 80GB"),
], ids=["adamw-cpu", "momentum-cuda"])
def test_a_stack_of_period_three_with_a_remainder_folds(cfg):
    """22 layers of period 3: unit 0 holds layers 0-3 (the one past seven whole periods), units 1-6 three each; four
    units traced, 13 layers. Unit 1 frees what the larger unit 0 made as unit 2 frees unit 1's: counted from the end
    of the unit they are in (from its start, the first rung's middle units would differ)."""
    fold, _, _ = _both(_llama(layers=22, tweak=_mlp_widths((40, 48, 56))), cfg)
    assert fold == {"folded": True, "stack": "layers", "blocks": 22, "traced_blocks": 13, "period": 3}


def test_a_period_that_breaks_once_falls_back_and_says_where():
    fold, _, _ = _both(_llama(layers=20, tweak=_mlp_widths((40, 48, 56), odd=13)),
                       TrainConfig(batch_size=2, optimizer="adamw", device="cpu"))
    assert fold["folded"] is False, fold
    assert fold["reason"] == ("layers: block 2 differs from block 1 at mlp.gate_proj.out_features; nor do they repeat "
                              "with a period of 2 to 8 blocks (the longest run, every 3, breaks at block 13 differs "
                              "from block 4 at mlp.gate_proj.out_features)"), fold


def test_the_fold_field_says_its_period_and_older_json_reads_as_period_one():
    from engine.results.estimate_fields import TraceFold

    two = TraceFold(True, "model.layers", 42, 8, period=2)
    assert two.to_json() == {"folded": True, "stack": "model.layers", "blocks": 42, "traced_blocks": 8, "period": 2}
    assert TraceFold.from_json(two.to_json()) == two
    old = {"folded": True, "stack": "h", "blocks": 12, "traced_blocks": 4}
    assert TraceFold.from_json(old).period == 1 and TraceFold.from_json(old).to_json() == old


# -- models whose blocks differ, or that the cut stack breaks -------------------------------------------------------

def _checkpoint_block_4(model: nn.Module) -> None:
    block = model.layers[4]
    inner = block.forward

    def forward(*args: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(inner, *args, use_reentrant=False)

    block.forward = forward


def _hook_block_5(model: nn.Module) -> None:
    model.layers[5].register_forward_hook(lambda mod, args, out: out * 2)


def _lora_on_layer_3(model: nn.Module) -> None:
    from peft import LoraConfig, inject_adapter_in_model

    inject_adapter_in_model(LoraConfig(r=4, target_modules=["layers.3.self_attn.q_proj"]), model)


def _index_every_layer(model: nn.Module) -> None:
    def forward(input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        from engine.models.templates.llama import rotary
        from engine.models.templates.lm_loss import lm_output

        x = model.embed_tokens(input_ids)
        c = model.config
        cos, sin = rotary(input_ids.shape[1], c.hidden // c.heads, c.rope_theta, x.device, x.dtype)
        for i in range(c.layers):  # by index, not by iterating the container
            x = model.layers[i](x, cos, sin)
        return lm_output(model.lm_head(model.norm(x)), labels)

    model.forward = forward


@pytest.mark.parametrize("tweak, words", [
    (_checkpoint_block_4, "block 4 differs from block 1 at forward"),
    (_hook_block_5, "block 5 differs from block 1 at _forward_hooks"),
    (_lora_on_layer_3, "block 3 has other submodules, parameters or attributes than block 1"),
    (_index_every_layer, "the model's code indexes block 6 of the 8, past the 6 traced"),
], ids=["checkpointing-one-block", "a-hook-on-one-block", "lora-on-one-layer", "indexes-past-the-cut"])
def test_a_model_whose_blocks_differ_falls_back(tweak, words):
    # (a tweak is the user's own code, traced in full by default: asked to fold, the checks see each)
    fold, _, _ = _both(_llama(tweak=tweak), TrainConfig(batch_size=2, optimizer="adam", device="cpu",
                                                        fold_own_code=True))
    assert fold["folded"] is False and words in fold["reason"], fold


def test_a_short_stack_is_traced_in_full():
    fold, _, _ = _both(_llama(layers=MIN_BLOCKS - 1), TrainConfig(batch_size=2, device="cpu"))
    assert fold == {"folded": False, "reason": f"no ModuleList or Sequential of {MIN_BLOCKS} or more blocks"}


def test_generation_is_traced_in_full():
    _trace, info = trace_model(HFConfigSource(dict(TINY_LLAMA), "llama", "test"),
                               TrainConfig(batch_size=1, mode="generate", prompt_len=8, new_tokens=3, device="cpu"))
    assert info.fold is not None
    assert info.fold.to_json() == {"folded": False,
                                   "reason": "generation is traced in full (its KV cache holds a slot per layer)"}


# -- the option --------------------------------------------------------------------------------------------------

def test_full_trace_is_a_cli_option_and_a_config_field(capsys):
    rc = entry.main(["estimate", "gpt2", "--seq-len", "8", "--device", "cpu", "--json"])
    folded = json.loads(capsys.readouterr().out)
    rc_full = entry.main(["estimate", "gpt2", "--seq-len", "8", "--device", "cpu", "--json", "--full-trace"])
    full = json.loads(capsys.readouterr().out)
    assert rc == rc_full == 0
    assert folded["extra"]["trace_fold"] == {"folded": True, "stack": "h", "blocks": 12,
                                             "traced_blocks": FIRST_RUNG}
    assert full["extra"]["trace_fold"] == {"folded": False, "reason": "the full trace was asked for"}
    assert full["config"]["full_trace"] is True and folded["config"]["full_trace"] is False
    assert folded["peak_bytes"] == full["peak_bytes"] and folded["timeline"] == full["timeline"]
    assert TrainConfig.from_options({"full_trace": True}).full_trace


def test_a_plans_units_and_block_indices_map_both_ways():
    """22 blocks of period 3: unit 0 holds blocks 0-3 (the remainder, block 3, with it), units 1-6 three each; the
    traced units (four at the first rung) are the stack's first 13 blocks."""
    blocks: list[nn.Module] = [nn.Linear(2, 2) for _ in range(22)]
    plan = FoldPlan("layers", nn.Module(), nn.ModuleList(blocks), blocks, period=3)
    assert [len(list(u.children())) for u in plan.units] == [4, 3, 3, 3, 3, 3, 3]
    assert [m for u in plan.units for m in u.children()] == blocks
    assert [plan.unit_of(b) for b in (0, 3, 4, 6, 7, 21)] == [(0, 0), (0, 3), (1, 0), (1, 2), (2, 0), (6, 2)]
    assert all(plan.block(*plan.unit_of(b)) == b for b in range(22))
    assert plan.cut == 13 and list(plan.units[1].named_parameters())[0][0] == "0.weight"
    one = FoldPlan("layers", nn.Module(), nn.ModuleList(blocks), blocks)
    assert one.units == blocks and one.cut == 4 and one.unit_of(5) == (5, 0)


# -- a residual added in the model's own loop ---------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class _OuterResidual(nn.Module):
    """`x = x + block(x)` in the model's loop, not inside the block (a user's own model often does this)."""

    def __init__(self, layers: int, d: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(d) for _ in range(layers))
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x).sum()


@pytest.mark.parametrize("layers", [8, 12, 30])
@pytest.mark.parametrize("kw", [dict(gpu="A100 80GB"), dict(device="cpu"), dict(gpu="A100 80GB", checkpointing=True),
                                dict(gpu="A100 80GB", mode="inference"), dict(gpu="A100 80GB", grad_accum=2)],
                         ids=["cuda", "cpu", "checkpointing", "inference", "grad-accum"])
def test_a_residual_added_outside_the_blocks_folds_to_the_full_trace(layers, kw):
    """The gradient autograd sums in place along the residual is made in the last block's backward and freed in
    the first's: the head's free of it was written as the block that many after the head (a middle one, which
    holds no such storage), and every such model was traced in full ("a written block would free a storage it
    does not hold"). It is the tail's storage, wherever the tail is written. It folds at the second rung: the
    loop's last add, after the stack, reads the last but one block's output, a middle block at the first
    (engine.trace.fold_reads)."""
    src = _Fn(f"outer-residual-{layers}",
              lambda cfg: (_OuterResidual(layers), {"x": torch.randn(cfg.batch_size, 16, 32)}))
    fold, est, _ = _both(src, TrainConfig(**{"batch_size": 2, "optimizer": "adamw", "fold_own_code": True, **kw}))
    _assert_folded(fold, layers, SECOND_RUNG)
    assert est.peak_bytes > 0
