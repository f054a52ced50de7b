"""`vramscope.estimate_step(step, *args)`: the user's own step (two optimizers over parameter groups, clipping, a
custom loss, accumulation, a scheduler, a bound method) traced on fake copies, against the same step run for real
on this CPU and measured by PyTorch's profiler as the tracer's accuracy tests measure the canonical step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

import vramscope
from engine.core.errors import UserError
from engine.measure.cpu_profiler import _allocations
from engine.trace.cpu_kernels import quiet_profiler

HERE = Path(__file__).name


def measure_real_step(step, *args, holders=()) -> int:
    """The real step's peak of live tensor bytes over two calls: what existed before it (the parameters and buffers
    of the models, the optimizers' state, the tensors given; `holders`: models and optimizers the step reaches
    otherwise) plus the highest running sum of the CPU allocator's events during it (engine.measure.cpu_profiler)."""
    before: dict[int, int] = {}

    def add(t: torch.Tensor) -> None:
        before.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())

    for a in (*args, *holders):
        if isinstance(a, nn.Module):
            for t in [*a.parameters(), *a.buffers()]:
                add(t)
        elif isinstance(a, torch.optim.Optimizer):
            for t in (v for state in a.state.values() for v in state.values() if isinstance(v, torch.Tensor)):
                add(t)
        elif isinstance(a, torch.Tensor):
            add(a)
    with quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                                   with_stack=True) as prof:
        for _ in range(2):
            out = step(*args)
            del out
    cur = peak = 0
    for _t, _ptr, n, _op, _mod in _allocations(prof):
        cur += n
        peak = max(peak, cur)
    return sum(before.values()) + peak


def focal_loss(logits: torch.Tensor, y: torch.Tensor, gamma: float = 2.0) -> torch.Tensor:
    logp = F.log_softmax(logits, -1).gather(1, y[:, None])
    return -((1 - logp.exp()) ** gamma * logp).mean()


class Tagger(nn.Module):
    """A model no other test uses: an embedding, a GRU and a two-layer head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(500, 48)
        self.rnn = nn.GRU(48, 64, batch_first=True)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Sequential(nn.Linear(64, 96), nn.SiLU(), nn.Linear(96, 7))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(tokens))
        return self.head(self.norm(h[:, -1]))


def tagger_setup():
    torch.manual_seed(0)
    model = Tagger()
    body = [*model.emb.parameters(), *model.rnn.parameters()]
    no_decay = list(model.norm.parameters())
    opt_body = torch.optim.AdamW([{"params": body, "lr": 1e-3}, {"params": no_decay, "weight_decay": 0.0}])
    opt_head = torch.optim.SGD(model.head.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt_body, 100)
    tokens, labels = torch.randint(0, 500, (24, 30)), torch.randint(0, 7, (24,))
    return model, opt_body, opt_head, sched, tokens, labels


def two_optimizer_step(model, opt_body, opt_head, sched, tokens, labels):
    opt_body.zero_grad(set_to_none=True)
    opt_head.zero_grad(set_to_none=True)
    loss = focal_loss(model(tokens), labels) + 1e-4 * model.head[0].weight.pow(2).sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt_body.step()
    opt_head.step()
    sched.step()
    return loss.detach()


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 24, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(24, 48, 4, 2, 1),
                                 nn.BatchNorm2d(48), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(48 * 4 * 4, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def gan_setup():
    torch.manual_seed(1)
    gen = nn.Sequential(nn.Linear(32, 48 * 4 * 4), nn.Unflatten(1, (48, 4, 4)), nn.ConvTranspose2d(48, 24, 4, 2, 1),
                        nn.ReLU(), nn.ConvTranspose2d(24, 3, 4, 2, 1), nn.Tanh())
    critic = Critic()
    return (gen, critic, torch.optim.Adam(gen.parameters(), 2e-4, betas=(0.5, 0.999)),
            torch.optim.RMSprop(critic.parameters(), 5e-5), torch.randn(16, 3, 16, 16), torch.randn(16, 32))


def gan_step_with_accumulation(gen, critic, opt_g, opt_c, real, noise):
    """Two micro-batches for the critic (accumulated, each half the batch), then one generator step."""
    opt_c.zero_grad(set_to_none=True)
    for half in (slice(0, 8), slice(8, 16)):
        fake = gen(noise[half]).detach()
        loss_c = (F.softplus(critic(fake)) + F.softplus(-critic(real[half]))).mean() / 2
        loss_c.backward()
    torch.nn.utils.clip_grad_value_(critic.parameters(), 0.5)
    opt_c.step()
    opt_g.zero_grad(set_to_none=True)
    loss_g = F.softplus(-critic(gen(noise))).mean()
    loss_g.backward()
    opt_g.step()


@pytest.mark.parametrize("setup, step", [(tagger_setup, two_optimizer_step), (gan_setup, gan_step_with_accumulation)],
                         ids=["two-optimizers-clipping-focal-loss", "gan-accumulation-two-models"])
def test_estimate_step_matches_the_real_cpu_step(setup, step):
    est = vramscope.estimate_step(step, *setup(), device="cpu")
    measured = measure_real_step(step, *setup())
    err = abs(est.peak_bytes - measured) / measured
    assert err <= 0.01, f"estimated {est.peak_bytes:,} B, measured {measured:,} B ({err:.3%})"
    assert sum(est.breakdown_at_peak.values()) == est.peak_bytes == max(p.total for p in est.timeline)
    assert {(s.step, s.phase) for s in est.phases} >= {(1, "forward"), (1, "backward"), (1, "optimizer")}
    assert est.config.mode == "train" and est.step.training


def scaler_setup():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4))
    return (model, torch.optim.Adam(model.parameters()), torch.amp.GradScaler("cpu"), torch.randn(16, 64),
            torch.randint(0, 4, (16,)))


def autocast_scaler_step(model, opt, scaler, x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


def test_a_step_with_cpu_autocast_and_a_grad_scaler_matches_the_real_step():
    """The scaler's step reads whether gradients overflowed (a value): the traced copy's always steps, as the real
    one does here (fp32 gradients of a small model do not overflow)."""
    est = vramscope.estimate_step(autocast_scaler_step, *scaler_setup(), device="cpu")
    measured = measure_real_step(autocast_scaler_step, *scaler_setup())
    assert abs(est.peak_bytes - measured) / measured <= 0.01, (est.peak_bytes, measured)
    assert est.config.precision == "amp-bf16" and est.step.autocast == "bfloat16"


def closure_setup():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv1d(4, 16, 5, padding=2), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 40, 3))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3), torch.randn(12, 4, 40), torch.randint(0, 3, (12,))


def closure_step(model, opt, x, y):
    """Lightning's way: the forward and backward in a closure the optimizer's step calls."""

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        return loss

    return opt.step(closure)


def test_a_closure_run_by_the_optimizers_step_is_traced_with_its_phases():
    est = vramscope.estimate_step(closure_step, *closure_setup(), device="cpu")
    measured = measure_real_step(closure_step, *closure_setup())
    assert abs(est.peak_bytes - measured) / measured <= 0.01, (est.peak_bytes, measured)
    # the step's pre-hook comes first (the closure's zero_grad frees the last gradients), then the closure's forward
    # is a forward, its backward a backward, and the update the optimizer's
    assert [s.phase for s in est.phases if s.step == 1] == ["optimizer", "forward", "backward", "optimizer"]
    assert max(p.by_category["activations"] for p in est.timeline) > 12 * 16 * 40 * 4  # the conv's saved output


def test_two_optimizers_state_and_the_models_bytes_are_categorised():
    model, *rest = tagger_setup()
    est = vramscope.estimate_step(two_optimizer_step, model, *rest, device="cpu")
    n_body = sum(p.numel() for m in (model.emb, model.rnn, model.norm) for p in m.parameters())
    n_head = sum(p.numel() for p in model.head.parameters())
    tensors_body = len([*model.emb.parameters(), *model.rnn.parameters(), *model.norm.parameters()])
    end = est.timeline[-1].by_category
    # AdamW: two moments and a 4-byte step per tensor; SGD with momentum: one buffer
    assert end["optimizer_state"] == 2 * 4 * n_body + 4 * tensors_body + 4 * n_head
    assert est.breakdown_at_peak["parameters"] == 4 * (n_body + n_head) == 4 * est.parameters
    assert end["gradients"] == 4 * est.parameters  # zero_grad(set_to_none) comes at the top of the next step
    assert est.step.optimizers == ("opt_body (AdamW)", "opt_head (SGD)")
    assert est.step.schedulers == ("sched (CosineAnnealingLR)",)
    assert est.config.optimizer == "adamw" and est.config.batch_size == 24
    rows = {r.name: r for r in est.per_module}
    assert rows["head.0"].parameter_bytes == 4 * (64 * 96 + 96)


def test_the_users_objects_are_left_unchanged():
    model, opt_body, opt_head, sched, tokens, labels = tagger_setup()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    vramscope.estimate_step(two_optimizer_step, model, opt_body, opt_head, sched, tokens, labels, device="cpu")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not opt_body.state and not opt_head.state and sched.last_epoch == 0
    assert all(p.grad is None for p in model.parameters())


class Trainer:
    """A Lightning-style object: the step is its method, reaching the model and optimizer through self."""

    def __init__(self) -> None:
        torch.manual_seed(2)
        self.model = nn.Sequential(nn.Linear(20, 40), nn.Tanh(), nn.Linear(40, 1))
        self.opt = torch.optim.Adagrad(self.model.parameters())

    def training_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        loss = F.huber_loss(self.model(x).squeeze(1), y)
        loss.backward()
        self.opt.step()
        return loss.detach()


def test_a_bound_method_is_traced_on_a_copy_of_its_object():
    x, y = torch.randn(10, 20), torch.randn(10)
    trainer = Trainer()
    est = vramscope.estimate_step(trainer.training_step, x, y, device="cpu")
    fresh = Trainer()
    measured = measure_real_step(fresh.training_step, x, y, holders=(fresh.model, fresh.opt))
    assert abs(est.peak_bytes - measured) / measured <= 0.01
    assert est.config.optimizer == "adagrad"
    states = [st for st in trainer.opt.state.values()]  # Adagrad makes its state when it is built: left as it was
    assert all(st["step"].item() == 0 and not st["sum"].any() for st in states) and len(states) == 4


def test_an_inference_step_is_an_inference_estimate():
    model = Tagger().eval()

    @torch.no_grad()
    def predict(model, tokens):
        return model(tokens).argmax(-1)

    est = vramscope.estimate_step(predict, model, torch.randint(0, 500, (8, 30)), device="cpu")
    assert est.config.mode == "inference" and est.breakdown_at_peak["gradients"] == 0
    assert est.peak_phase == "forward"


def test_a_gpu_target_gives_the_canonical_steps_figures_and_honours_cuda_autocast():
    """A user's step written as the canonical one (AMP's recipe: the forward and the loss under
    torch.autocast("cuda"), then backward, AdamW's step, zero_grad) gives `vramscope.estimate`'s figures for that
    configuration on a GPU: the same peak, allocator reserve, nvidia-smi figure and verdict."""

    def amp_step(model, opt, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512), nn.Linear(512, 10))
    x = torch.randn(256, 512)
    own = vramscope.estimate_step(amp_step, model, torch.optim.AdamW(model.parameters()), x, gpu="A100 80GB")
    canonical = vramscope.estimate(model, x, optimizer="adamw", precision="amp-bf16", gpu="A100 80GB")
    assert own.config.precision == "amp-bf16" and own.step.autocast == "bfloat16"
    assert own.gpu is not None and canonical.gpu is not None and own.gpu.gpu_name == "A100 80GB"
    # a few 0-d tensors (the loss, its gradient) live until the user's step returns; the canonical step drops them
    assert abs(own.peak_bytes - canonical.peak_bytes) <= 64
    for figure in ("reserved_bytes", "nvidia_smi_bytes", "verdict", "cuda_context_bytes", "workspace_bytes"):
        assert getattr(own.gpu, figure) == getattr(canonical.gpu, figure), figure


def _setup_small():
    model = nn.Linear(8, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(4, 8)


def test_an_exception_in_the_users_step_is_one_line_naming_their_line():
    def bad_step(model, opt, x):
        out = model(x)
        return out @ torch.ones(3, 3)  # the line named

    line = bad_step.__code__.co_firstlineno + 2
    with pytest.raises(UserError) as err:
        vramscope.estimate_step(bad_step, *_setup_small(), device="cpu")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"tests/{HERE}:{line}: RuntimeError: ") and "in " in msg


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).view(3, 7)  # the line named: the deepest of the user's own code


def test_a_model_failing_inside_the_step_names_the_models_line():
    def step(model, opt, x):
        model(x).sum().backward()

    model = Broken()
    with pytest.raises(UserError) as err:
        vramscope.estimate_step(step, model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(4, 8),
                                device="cpu")
    line = Broken.forward.__code__.co_firstlineno + 1
    assert str(err.value).startswith(f"tests/{HERE}:{line}: RuntimeError: shape '[3, 7]' is invalid")


def test_code_that_needs_a_tensors_value_is_one_line_naming_the_line():
    def logging_step(model, opt, x):
        loss = model(x).sum()
        print(f"loss {loss.item():.3f}")  # the line named
        loss.backward()

    def masking_step(model, opt, x):
        kept = x[x > 0]  # the line named: its size depends on the data
        return model(kept.view(-1, 8)) if kept.numel() else None

    for step, offset in ((logging_step, 2), (masking_step, 1)):
        with pytest.raises(UserError) as err:
            vramscope.estimate_step(step, *_setup_small(), device="cpu")
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(f"tests/{HERE}:{step.__code__.co_firstlineno + offset}: ")
        assert "needs a tensor's value" in msg and "keep such code out of the step" in msg


def test_a_step_that_moves_tensors_to_cuda_is_told_to_use_the_models_device():
    def cuda_step(model, opt, x):
        x = x.to("cuda")  # the line named
        model(x).sum().backward()

    with pytest.raises(UserError) as err:
        vramscope.estimate_step(cuda_step, *_setup_small())
    msg = str(err.value)
    assert msg.startswith(f"tests/{HERE}:{cuda_step.__code__.co_firstlineno + 1}: ") and "\n" not in msg
    assert "moves a tensor to CUDA, but the step is traced on fake CPU tensors" in msg
    assert "x.to(next(model.parameters()).device)" in msg


GLOBAL_MODEL = nn.Linear(8, 2)


def uses_a_global(x):
    return GLOBAL_MODEL(x).sum().backward()


LOSS = nn.SmoothL1Loss()  # a module without weights: fine as a global


def uses_a_global_loss(model, opt, x):
    LOSS(model(x), torch.zeros(4, 2)).backward()
    opt.step()


def test_a_model_reached_outside_the_arguments_is_refused_by_name():
    est = vramscope.estimate_step(uses_a_global_loss, *_setup_small(), device="cpu")
    assert est.config.mode == "train" and est.breakdown_at_peak["parameters"] == 4 * (8 * 2 + 2)
    with pytest.raises(UserError, match=r"uses_a_global uses 'GLOBAL_MODEL' \(a Linear\) from outside its "
                                        r"arguments; pass it as one"):
        vramscope.estimate_step(uses_a_global, torch.randn(4, 8), device="cpu")
    assert GLOBAL_MODEL.weight.grad is None


def test_option_and_argument_mistakes_are_one_line():
    def step(model, opt, x):
        model(x).sum().backward()

    with pytest.raises(UserError, match="optimizer= is set by your step itself.*options are device=, gpu=, "
                                        "alloc_conf="):
        vramscope.estimate_step(step, *_setup_small(), optimizer="adam")
    with pytest.raises(UserError, match="step cannot take these arguments: too many positional arguments"):
        vramscope.estimate_step(step, *_setup_small(), torch.ones(1), device="cpu")
    with pytest.raises(UserError, match="is given no torch.nn.Module: pass the model"):
        vramscope.estimate_step(lambda x: x * 2, torch.ones(3), device="cpu")
