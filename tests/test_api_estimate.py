"""`vramscope.estimate(model, inputs, **options)` on model objects: the CLI's estimate of the same model, exact
against the same step run for real on the CPU, and the user's model left as it was."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from torch import nn

import main as entry
import vramscope
from engine.core.errors import UserError
from engine.measure.cpu_profiler import measure_cpu
from engine.models.object_source import ObjectSource


class TinyHybrid(nn.Module):
    """A model no other test uses: a conv stem with BatchNorm, a token mixer (attention) and a head tied to the
    stem's embedding of class ids."""

    def __init__(self, classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.GELU())
        self.mix = nn.MultiheadAttention(width, 4, batch_first=True)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x).flatten(2).transpose(1, 2)  # (batch, tokens, width)
        h = self.norm(h + self.mix(h, h, h, need_weights=False)[0])
        return self.head(h.mean(1))


def _model_and_batch() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return TinyHybrid(), torch.randn(6, 3, 24, 24)


@pytest.mark.parametrize("options", [dict(optimizer="adamw"), dict(optimizer="sgd-momentum", grad_accum=2),
                                     dict(mode="inference")], ids=["adamw", "sgd-momentum-accum2", "inference"])
def test_estimate_of_a_model_object_matches_the_real_cpu_step(options):
    model, x = _model_and_batch()
    est = vramscope.estimate(model, x, device="cpu", **options)
    _trace, _info, measured = measure_cpu(ObjectSource(model, x), est.config)
    err = abs(est.peak_bytes - measured) / measured
    assert err <= 0.01, f"estimated {est.peak_bytes:,} B, measured {measured:,} B ({err:.2%})"
    assert est.config.batch_size == 6 and est.model_name == "TinyHybrid"
    assert est.parameters == sum(p.numel() for p in model.parameters())


def test_the_users_model_and_inputs_are_left_unchanged():
    model, x = _model_and_batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x0 = x.clone()
    model.eval()
    vramscope.estimate(model, x, device="cpu", optimizer="adam")
    assert not model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BatchNorm's statistics too
    assert torch.equal(x, x0) and model.head.weight.device.type == "cpu"


def test_a_meta_model_and_one_built_under_fake_give_the_real_models_figures():
    model, x = _model_and_batch()
    real = vramscope.estimate(model, x, device="cpu", optimizer="adamw")
    with vramscope.fake():
        faked = TinyHybrid()
    with torch.device("meta"):
        meta = TinyHybrid()
    assert faked.head.weight.device.type == "meta"
    for other in (faked, meta):
        est = vramscope.estimate(other, x, device="cpu", optimizer="adamw")
        assert est.peak_bytes == real.peak_bytes and est.breakdown_at_peak == real.breakdown_at_peak


def test_fake_builds_a_model_larger_than_this_machine_without_memory():
    with vramscope.fake():
        big = nn.Sequential(*[nn.Linear(32768, 32768) for _ in range(64)])  # 68.7 G parameters: 256 GiB in fp32
    est = vramscope.estimate(big, torch.randn(1, 32768), mode="inference", gpu="H200")
    assert est.parameters == 64 * (32768 * 32768 + 32768)
    assert est.gpu is not None and est.gpu.verdict == "does not fit"
    assert est.breakdown_at_peak["parameters"] == 4 * est.parameters


def test_the_api_gives_the_clis_estimate_of_the_same_model(tmp_path, capsys):
    """Each keyword is the CLI's option of the same name with the same value: a model file estimated by
    `vramscope estimate` and the same model object estimated from Python give the same figures."""
    f = tmp_path / "hybrid.py"
    f.write_text(textwrap.dedent("""
        import torch
        from tests.test_api_estimate import TinyHybrid

        def build(batch_size):
            return TinyHybrid(), torch.randn(batch_size, 3, 24, 24)
    """))
    out = tmp_path / "cli.json"
    code = entry.main(["estimate", f"{f}:build", "--batch-size", "6", "--optimizer", "adamw", "--precision",
                       "amp-bf16", "--gpu", "A100 80GB", "--checkpointing", "-o", str(out)])
    capsys.readouterr()
    assert code == 0
    cli = json.loads(out.read_text())
    model, x = _model_and_batch()
    api = vramscope.estimate(model, x, optimizer="adamw", precision="amp-bf16", gpu="A100 80GB",
                             checkpointing=True).to_json()
    for key in ("peak_bytes", "breakdown_at_peak", "config", "parameters", "peak_phase", "peak_module"):
        assert api[key] == cli[key], key
    for key in ("reserved_bytes", "nvidia_smi_bytes", "verdict", "breakdown_at_live_peak"):
        assert api["gpu"][key] == cli["gpu"][key], key


def test_option_mistakes_are_one_line_naming_the_keyword():
    model, x = _model_and_batch()
    with pytest.raises(UserError, match=r"optimiser= is not an option \(did you mean optimizer\?\)"):
        vramscope.estimate(model, x, optimiser="adamw")
    with pytest.raises(UserError, match="batch_size=8 is not an option: it is the inputs' first dimension"):
        vramscope.estimate(model, x, batch_size=8)
    with pytest.raises(UserError, match="unknown optimizer 'adamm'.*did you mean 'adam"):
        vramscope.estimate(model, x, optimizer="adamm")
    with pytest.raises(UserError, match="optimizer only applies to training; drop it or use mode='train'"):
        vramscope.estimate(model, x, mode="inference", optimizer="sgd")
    with pytest.raises(UserError, match="gpu='H100' asks for a GPU verdict, which device='cpu' has none of"):
        vramscope.estimate(model, x, device="cpu", gpu="H100")
    with pytest.raises(UserError, match="inputs must be a tensor, a tuple or list of arguments, or a dict"):
        vramscope.estimate(model, 3.0)
    with pytest.raises(UserError, match="model must be a torch.nn.Module; got function"):
        vramscope.estimate(_model_and_batch, x)


def test_a_model_that_fails_on_its_inputs_names_the_module():
    model, _x = _model_and_batch()
    with pytest.raises(UserError) as err:
        vramscope.estimate(model, torch.randn(2, 5, 24, 24), device="cpu")
    msg = str(err.value)
    assert "\n" not in msg and "module 'stem.0' (Conv2d) failed" in msg


def test_peft_adapters_go_on_the_copy_not_on_the_users_model():
    model, x = _model_and_batch()
    names = [n for n, _m in model.named_modules()]
    est = vramscope.estimate(model, x, device="cpu", peft="lora", lora_targets="all-linear", lora_rank=4)
    assert [n for n, _m in model.named_modules()] == names and all(p.requires_grad for p in model.parameters())
    head = 32 * 4 + 4 * 10  # the head's A (rank 4 × 32 inputs) and B (10 outputs × rank 4)
    assert est.trainable_parameters > head and est.trainable_parameters < est.parameters
    assert est.breakdown_at_peak["adapter_weights"] == 4 * est.trainable_parameters
