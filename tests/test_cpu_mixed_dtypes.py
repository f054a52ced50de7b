"""What the CPU's kernels allocate for an op given tensors of two floating dtypes (a bf16 base layer's output plus a
float32 LoRA adapter's, as peft adds them): TensorIterator casts the other operands to the common dtype in
temporaries of their full size before it computes (engine.trace.recorder._mixed_floats has such calls probed for
real). Without them the plain Llama template's LoRA all-linear step with checkpointing was 3.45 % under its real CPU
run: its backward recomputes those additions at the peak."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import vramscope
from engine.measure.cpu_profiler import measure_cpu
from engine.planning.estimator import estimate

sys.path.insert(0, str(Path(__file__).parent))
from test_api_step import measure_real_step  # noqa: E402 - the tests' own real-step measurement


class MixedSum(nn.Module):
    """A bf16 layer's output plus a float32 layer's: the sum is float32, the bf16 operand cast first."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(256, 1024, bias=False).to(torch.bfloat16)
        self.side = nn.Linear(256, 1024, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x.to(torch.bfloat16)) + self.side(x)


def test_a_mixed_dtype_addition_is_charged_its_cast_on_the_cpu() -> None:
    torch.manual_seed(0)
    model, x = MixedSum(), torch.randn(512, 256)
    est = vramscope.estimate(model, x, device="cpu", mode="inference")

    def step(model: nn.Module, x: torch.Tensor) -> None:
        with torch.no_grad():
            model(x)

    real = measure_real_step(step, model, x)
    assert abs(est.peak_bytes - real) <= 64, (est.peak_bytes, real)
    bf16_out = 512 * 1024 * 2
    same = vramscope.estimate(nn.Sequential(nn.Linear(256, 1024, bias=False)), x, device="cpu", mode="inference")
    assert est.peak_bytes >= same.peak_bytes + bf16_out + 2 * bf16_out  # (its output, and the float32 copy of it)


@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj"])
def test_the_llama_templates_lora_with_checkpointing_matches_its_real_cpu_run(targets: str) -> None:
    pytest.importorskip("peft")
    from test_peft_quantized import TinyLlama, _cfg

    cfg = _cfg(peft="lora", lora_targets=targets, checkpointing=True)
    est = estimate(TinyLlama(), cfg)
    _trace, _info, real = measure_cpu(TinyLlama(), cfg)
    # What is left is the CPU generator's state each checkpointed block keeps for its recompute (torch.get_rng_state,
    # a host tensor on a GPU), two of them alive at the peak, and a few 0-dim scalars
    rng = torch.get_rng_state().nbytes
    assert 0 <= real - est.peak_bytes - 2 * rng <= 128, (est.peak_bytes, real, real - est.peak_bytes)
