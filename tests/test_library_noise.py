"""The optional libraries' start-up noise stays out of the terminal, and nothing else is hidden: a LoRA estimate of a
Hugging Face Llama run from the command line prints no transformers/peft deprecation and no bitsandbytes notice;
warnings of the project's own (and the libraries' other messages) still show."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY_LLAMA = dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


@pytest.mark.parametrize("extra", [[], ["--checkpointing"]], ids=["lora", "lora-checkpointed"])
def test_a_lora_estimate_prints_its_answer_and_no_library_noise(tmp_path, extra):
    """Checkpointed, transformers also says, once, that it trains the model without its KV cache."""
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "estimate", str(tmp_path), "--peft", "lora",
                        "--device", "cpu", "--seq-len", "32", "--batch-size", "1", *extra], cwd=ROOT,
                       env={**os.environ, "PYTHONWARNINGS": ""}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "peak" in r.stdout.lower()
    assert r.stderr == "", r.stderr  # was: FutureWarning `is_gradient_checkpointing`, "No module named 'kernels'"


def test_the_projects_own_warnings_and_the_libraries_other_messages_still_show(caplog):
    from engine.core.library_noise import quiet_libraries

    quiet_libraries()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        warnings.warn("the project's own deprecation", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["the project's own deprecation"]
    with caplog.at_level(logging.WARNING):
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning("another bitsandbytes warning")
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'.")
    assert [rec.getMessage() for rec in caplog.records] == ["another bitsandbytes warning"]
