"""The planner's reused answers equal fresh estimates: an optimizer-only candidate answered from the traced step
(engine.planning.reuse) is, event for event and figure for figure, the estimate tracing it anew gives; and the
gradient-accumulation lever suggests the largest micro-batch that fits."""

import json
import textwrap
from dataclasses import replace
from types import SimpleNamespace

import pytest

from engine.config.train_config import TrainConfig
from engine.models.sources import resolve_source
from engine.planning.estimator import estimate
from engine.planning.levers import Planning, accumulation
from engine.planning.planner import recommend
from engine.planning.reuse import NOTE, TracedStep, traced_step, with_optimizer

MLP = textwrap.dedent(
    """
    import torch
    from torch import nn

    def build(batch_size):
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        return model, torch.randn(batch_size, 256)
    """
)

# a small language model: a tied embedding, layer norms, attention, token ids (gradients of several owners)
TINY_LM = textwrap.dedent(
    """
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, 4, d // 4).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(512, 128)
            self.blocks = nn.ModuleList(Block(128) for _ in range(2))
            self.norm = nn.LayerNorm(128)

        def forward(self, ids):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return self.norm(x) @ self.emb.weight.t()

    def build(batch_size):
        return LM(), torch.randint(0, 512, (batch_size, 32))
    """
)


# a two-layer Llama config: transformers' own model, QLoRA's 4-bit base and adapters
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
              "max_position_embeddings": 2048}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    (d / "mlp.py").write_text(MLP)
    (d / "lm.py").write_text(TINY_LM)
    (d / "lm8.py").write_text(TINY_LM.replace("range(2)", "range(8)"))  # a stack that folds
    (d / "llama.json").write_text(json.dumps(TINY_LLAMA))
    return {"mlp": f"{d / 'mlp.py'}:build", "lm": f"{d / 'lm.py'}:build", "lm8": f"{d / 'lm8.py'}:build",
            "llama": str(d / "llama.json")}


def _events(est_trace):
    return [(e.nbytes, e.category, e.step, e.phase, e.module, e.op) for e in est_trace]


def _figures(est):
    g = est.gpu
    return (est.peak_bytes, est.peak_index, est.peak_step, est.peak_phase, est.peak_module, est.peak_op,
            est.breakdown_at_peak, est.per_module, est.timeline, est.phases, est.parameters,
            est.trainable_parameters, est.to_json()["extra"],
            None if g is None else (g.reserved_bytes, g.nvidia_smi_bytes, g.fits, g.margin_bytes))


BASES = [
    ("mlp", dict(device="cpu")),
    ("mlp", dict(gpu="A100 80GB")),
    ("lm", dict(gpu="A100 80GB", precision="amp-bf16")),
    ("lm", dict(device="cpu", grad_accum=3, optimizer="adamw")),
    ("lm", dict(gpu="H100", precision="bf16", checkpointing=True)),
    ("lm", dict(gpu="A100 80GB", precision="bf16", peft="lora", lora_targets="all-linear")),  # fp32 adapters
    ("llama", dict(gpu="A100 80GB", precision="bf16", peft="qlora", seq_len=64)),
    # 8 blocks: the estimate's trace and the swapped optimizer's steps fold (engine.trace.folded_optimizer)
    ("lm8", dict(device="cpu", optimizer="adamw")),
    ("lm8", dict(gpu="A100 80GB", precision="amp-bf16")),
]
CANDIDATES = [dict(optimizer="sgd-momentum"), dict(optimizer="adamw8bit"), dict(fused=True), dict(optimizer="sgd"),
              dict(optimizer="adagrad"), dict(optimizer="rmsprop"), dict(optimizer="paged-adamw8bit")]


@pytest.mark.parametrize("model,base_kw", BASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(BASES)])
def test_every_optimizer_swap_equals_a_fresh_estimate(models, model, base_kw):
    src = resolve_source(models[model])
    cfg = TrainConfig(batch_size=4, **base_kw)
    base_est, step = traced_step(src, cfg)
    assert _figures(base_est) == _figures(estimate(src, cfg))  # the kept trace is the estimate's own
    for change in CANDIDATES:
        new = cfg.with_(**change)
        reused = with_optimizer(src, step, new)
        assert reused is not None, change
        fresh_est, fresh = traced_step(src, new)
        assert _events(_spliced_trace(src, step, new)) == _events(fresh.trace.events), change
        assert _figures(reused) == _figures(fresh_est), change
        assert NOTE in reused.notes


def _spliced_trace(src, step, new):
    """The spliced trace itself (the Estimate keeps only its figures)."""
    from engine.planning import reuse as plan_reuse

    raw, roles, _owners, _modelled = plan_reuse._optimizer_phases(src, new, None)
    return plan_reuse._splice(step, raw, roles)[0]


def test_it_declines_what_it_cannot_reproduce(models):
    src = resolve_source(models["mlp"])
    cfg = TrainConfig(batch_size=4, device="cpu")
    _est, step = traced_step(src, cfg)
    assert with_optimizer(src, step, cfg.with_(batch_size=8, optimizer="sgd")) is None  # a new forward/backward
    assert with_optimizer(src, step, cfg.with_(precision="amp-bf16")) is None
    assert with_optimizer(src, step, cfg.with_(optimizer="none")) is None
    _est, scaled = traced_step(src, TrainConfig(batch_size=4, gpu="T4", precision="amp-fp16"))
    assert with_optimizer(src, scaled, scaled.cfg.with_(optimizer="sgd")) is None  # the GradScaler's unscale_


def test_every_recommendation_equals_a_fresh_estimate_of_its_configuration(models):
    src = resolve_source(models["lm"])
    cfg = TrainConfig(batch_size=8, gpu="T4", optimizer="adamw")
    recs = recommend(src, cfg)
    titles = [r.title for r in recs]
    assert any(t.startswith("SGD with momentum") for t in titles) and any("8-bit" in t for t in titles)
    for r in recs:
        if r.config is None:
            continue
        fresh = estimate(src, r.config)
        if r.config.world_size > 1:
            continue  # per rank, from the traced step (engine.parallel.sharding's own tests)
        assert (r.new_peak_bytes, r.new_nvidia_smi_bytes, r.fits) == (
            fresh.peak_bytes, fresh.gpu.nvidia_smi_bytes, fresh.gpu.fits), r.title


def test_quick_answers_carry_the_optimizer_swaps_when_the_trace_is_at_hand(models):
    src = resolve_source(models["lm"])
    cfg = TrainConfig(batch_size=8, gpu="T4", optimizer="adamw")
    base, step = traced_step(src, cfg)
    bare = {r.title for r in recommend(src, cfg, base=base, quick=True)}
    quick = recommend(src, cfg, base=base, quick=True, traced=step)
    titles = {r.title for r in quick}
    assert not any(t.startswith("SGD with momentum") for t in bare)  # no trace: only the analytic and sharding
    assert bare < titles and any(t.startswith("SGD with momentum") for t in titles)
    assert not any(t.startswith(("Mixed", "Activation", "Gradient accumulation")) for t in titles)  # re-traced
    full = {r.title: r for r in recommend(src, cfg, base=base, traced=step)}
    for r in quick:
        assert full[r.title].new_peak_bytes == r.new_peak_bytes


def test_the_full_plan_after_the_quick_one_does_not_trace_its_swaps_again(models, monkeypatch):
    """The app's Plan tab asks for the quick plan, then the full plan, of the same traced step: the optimizer swaps
    the quick plan traced are kept on the step, the same answers."""
    from engine.planning import reuse as plan_reuse

    traced: list[TrainConfig] = []
    real = plan_reuse._with_optimizer

    def counted(source, base, new_cfg, cancel):
        traced.append(new_cfg)
        return real(source, base, new_cfg, cancel)

    monkeypatch.setattr(plan_reuse, "_with_optimizer", counted)
    src = resolve_source(models["lm"])
    cfg = TrainConfig(batch_size=8, gpu="T4", optimizer="adamw")
    base, step = traced_step(src, cfg)
    quick = {r.title: r.to_json() for r in recommend(src, cfg, base=base, quick=True, traced=step)}
    swaps = list(traced)
    assert swaps and len(set(swaps)) == len(swaps)
    full = {r.title: r.to_json() for r in recommend(src, cfg, base=base, traced=step)}
    assert traced == swaps  # none traced again
    assert all(full[t] == r for t, r in quick.items())
    fresh = with_optimizer(src, TracedStep(step.trace, step.info, step.cfg, step.origin), swaps[0])
    kept = step.swapped[swaps[0]]
    assert fresh is not None and kept is not None and len(traced) == len(swaps) + 1
    assert fresh == replace(kept, elapsed_s=fresh.elapsed_s)  # (the time it took aside)


def test_the_apps_quick_plan_reuses_the_step_its_engine_process_traced(models):
    from engine.jobs import calls as jobs

    spec = ("ref", models["lm"])
    cfg = TrainConfig(batch_size=8, gpu="T4", optimizer="adamw")
    base = jobs.estimate(spec, cfg)
    assert jobs.kept_step(spec, cfg) is not None and jobs.kept_step(spec, cfg.with_(batch_size=4)) is None
    quick = {r.title: r for r in jobs.recommend(spec, cfg, base, quick=True)}
    sgd = next(r for t, r in quick.items() if t.startswith("SGD with momentum"))
    assert sgd.new_peak_bytes == estimate(resolve_source(models["lm"]), sgd.config).peak_bytes


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_candidates_traced_in_worker_processes_are_the_sequential_plans(models, monkeypatch, start):
    """The pool's answers are the sequential plan's, and its candidates are traced in the workers, not here: forked
    copies of this process (Linux, no CUDA context: the default), or spawned ones that resolve the model by name."""
    from engine.planning import planner, pool
    from engine.planning.levers import adapters, checkpointing, estimate_of_config, input_size, mixed_precision
    from engine.planning.pool import wanted_traces

    ref = models["lm"]
    src = resolve_source(ref)
    cfg = TrainConfig(batch_size=8, gpu="T4")
    base, step = traced_step(src, cfg)
    plan = Planning(src, cfg, base, lambda c: estimate(src, c))
    wanted = wanted_traces(plan, [mixed_precision, checkpointing, accumulation, adapters, input_size])
    assert wanted == [cfg.with_(precision="amp-fp16"), cfg.with_(checkpointing=True),  # a T4: no bf16
                      cfg.with_(batch_size=4, grad_accum=2), cfg.with_(peft="lora"), cfg.with_(peft="qlora")]
    one = recommend(src, cfg, base=base, traced=step)
    here: list[TrainConfig] = []  # the configurations traced in this process

    def counted(source, c, cancel=None):
        here.append(c)
        return estimate_of_config(source, c, cancel)

    monkeypatch.setattr(planner, "estimate_of_config", counted)
    monkeypatch.setattr(pool, "forks_workers", lambda device: start == "fork")
    if start == "spawn":
        assert pool.default_workers("cuda") == 1  # (spawned workers are for `--jobs N` only: each imports torch)
    two = recommend(src, cfg, base=base, traced=step, workers=2, ref=ref)
    assert [r.to_json() for r in two] == [r.to_json() for r in one]
    assert not set(here) & set(wanted), here


def test_a_reuse_that_fails_falls_back_to_the_full_trace(models):
    """The reuse is a shortcut: an error in it (a library failing to import on a thread, say) must not cost the
    answer, which the full trace then gives (and in quick mode: no answer, as without a trace)."""
    def broken(_cfg):
        raise AttributeError("module 'bitsandbytes' has no attribute 'optim'")

    traced = []
    src = resolve_source(models["mlp"])
    cfg = TrainConfig(batch_size=2, device="cpu")
    base = SimpleNamespace(peak_bytes=1, gpu=None)
    p = Planning(src, cfg, base, lambda c: traced.append(c) or "traced", reuse=broken)
    assert p.estimate(cfg.with_(optimizer="sgd"), reusable=True) == "traced" and traced == [cfg.with_(optimizer="sgd")]
    p.quick = True
    assert p.estimate(cfg.with_(optimizer="sgd"), reusable=True) is None


# ---------------------------------------------------------------------------------------- gradient accumulation


def _fake_planning(models, batch, fits_up_to, gpu="T4"):
    """A Planning whose estimates are a formula: micro-batches up to `fits_up_to` fit the GPU."""
    calls = []

    def run(c):
        calls.append(c.batch_size)
        return SimpleNamespace(peak_bytes=1000 + c.batch_size, gpu=SimpleNamespace(
            fits=c.batch_size <= fits_up_to, nvidia_smi_bytes=2000 + c.batch_size))

    cfg = TrainConfig(batch_size=batch, gpu=gpu)
    base = SimpleNamespace(peak_bytes=1000 + batch, gpu=None)
    return Planning(resolve_source(models["mlp"]), cfg, base, run), calls


@pytest.mark.parametrize("batch,fits_up_to,micro", [(64, 2, 2), (64, 40, 32), (96, 7, 6), (64, 0, 1), (7, 3, 1),
                                                   (1024, 100, 64)])
def test_accumulation_suggests_the_largest_micro_batch_that_fits(models, batch, fits_up_to, micro):
    """It tried only the first 3 divisors: batch 64 fitting at micro-batch 2 was offered as 8 micro-batches of 8,
    marked "does not fit"."""
    p, calls = _fake_planning(models, batch, fits_up_to)
    accumulation(p)
    (rec,) = p.out
    assert rec.config.batch_size == micro and rec.config.grad_accum == batch // micro
    assert rec.title == f"Gradient accumulation ({batch // micro} micro-batches of {micro})"
    assert rec.fits is (micro <= fits_up_to)
    divisors = [d for d in range(1, batch) if batch % d == 0]
    assert len(set(calls)) <= len(divisors).bit_length() + 1  # a bisection, not every divisor


def test_accumulation_tries_the_largest_micro_batch_first(models):
    """A step that nearly fits (its largest divisor does): one trace, not a bisection's log2(divisors)."""
    p, calls = _fake_planning(models, 64, 40)
    accumulation(p)
    assert calls == [32] and p.out[0].config.batch_size == 32
    p, calls = _fake_planning(models, 64, 2)
    accumulation(p)
    assert calls[0] == 32 and 32 not in calls[1:] and p.out[0].config.batch_size == 2


def test_accumulation_without_a_gpu_offers_two_micro_batches(models):
    p, _calls = _fake_planning(models, 64, 0, gpu=None)
    accumulation(p)
    assert [r.config.batch_size for r in p.out] == [32]


def test_accumulation_on_real_estimates_fits_and_the_next_divisor_does_not(models):
    src = resolve_source(models["mlp"])
    cfg = TrainConfig(batch_size=1 << 24, gpu="T4")  # fake tensors: a huge batch costs no memory here
    base = SimpleNamespace(peak_bytes=1 << 40, gpu=None)
    p = Planning(src, cfg, base, lambda c: estimate(src, c))
    accumulation(p)
    (rec,) = p.out
    micro = rec.config.batch_size
    assert rec.fits is True and micro < 1 << 21  # the first three divisors (2^23, 2^22, 2^21) do not fit
    fresh = estimate(src, rec.config)
    assert fresh.gpu.fits and fresh.peak_bytes == rec.new_peak_bytes
    bigger = estimate(src, cfg.with_(batch_size=micro * 2, grad_accum=cfg.batch_size // (micro * 2)))
    assert not bigger.gpu.fits


# ------------------------------------------------------------------------------------------------- the report


def test_the_report_waits_only_for_the_quick_answers_unless_asked(models, monkeypatch):
    import main
    from cli import report as cli_report
    from engine.planning import planner

    calls = []
    monkeypatch.setattr(planner, "recommend", lambda source, cfg, base=None, **kw: calls.append(kw) or [])
    monkeypatch.setattr(planner, "max_batch", lambda *a, **kw: calls.append("max_batch"))
    src = resolve_source(models["mlp"])
    cfg = TrainConfig(batch_size=2, gpu="T4")
    base, step = traced_step(src, cfg)
    assert cli_report._plan(src, cfg, base, full=False, traced=step) == ([], None, None)
    assert calls == [{"quick": True, "traced": step}]
    calls.clear()
    cli_report._plan(src, cfg, base, full=True, traced=step)
    assert calls == [{"quick": False, "traced": step}, "max_batch"]
    parse = main._build_parser().parse_args
    assert parse(["report", "gpt2", "-o", "r.pdf"]).plan == "quick"
    assert parse(["report", "gpt2", "-o", "r.pdf", "--plan", "full"]).plan == "full"
    assert parse(["report", "gpt2", "-o", "r.pdf", "--no-plan"]).plan == "none"


def test_a_swapped_optimizer_steps_over_the_traced_blocks_only(models, monkeypatch):
    """Deep models: the new optimizer's two steps run over the 4 traced blocks of 8 (and the rest of the model), the
    others written out (engine.trace.folded_optimizer); the swap above still equals the fresh estimate."""
    import torch

    from engine.planning import reuse as plan_reuse

    seen: list[int] = []
    real = torch.optim.SGD.step

    def step(self, *a, **kw):
        seen.append(sum(len(g["params"]) for g in self.param_groups))
        return real(self, *a, **kw)

    monkeypatch.setattr(torch.optim.SGD, "step", step)
    src = resolve_source(models["lm8"])  # (a model file: the user's own code, folded when asked)
    cfg = TrainConfig(batch_size=4, device="cpu", optimizer="sgd-momentum", fold_own_code=True)
    assert plan_reuse._optimizer_phases(src, cfg, None) is not None
    every, per_block = 1 + 8 * 12 + 2, 12  # the embedding, 8 blocks of 12 tensors, the final norm
    assert seen == [every - 4 * per_block] * 2


def test_a_cancelled_swap_stops_before_its_splice(models, monkeypatch):
    """The app cancels a plan job when the user edits: the swap stops at its next stage, not at its end."""
    import threading

    from engine.core.errors import Cancelled
    from engine.planning import reuse as plan_reuse

    src = resolve_source(models["lm"])
    cfg = TrainConfig(batch_size=4, device="cpu", optimizer="adamw")
    _est, step = traced_step(src, cfg)
    cancel = threading.Event()
    real = plan_reuse._optimizer_phases

    def phases_then_cancel(*a, **kw):
        out = real(*a, **kw)
        cancel.set()  # the edit arrives while the new optimizer's steps are traced
        return out

    monkeypatch.setattr(plan_reuse, "_optimizer_phases", phases_then_cancel)
    with pytest.raises(Cancelled):
        with_optimizer(src, step, cfg.with_(optimizer="sgd-momentum"), cancel)
