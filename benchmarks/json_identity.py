"""The estimate JSON before and after a change, byte for byte: `dump` writes the JSON of a set of varied CLI cases
(a template's training step, generation with and without a GPU, FSDP, ZeRO-2, tensor parallelism, LoRA and QLoRA,
checkpointing, the snapshots in tests/data opened alone and beside their model, a CPU profile, `plan` of a sharded
step, a user's own step), one file each, and two more: four `benchmarks.gpu_compare` cases' rows (gpu_compare.json)
and the estimate of every fast CPU-zoo case (zoo.json); `compare` says which files differ. What a rerun does not
repeat is left out of the comparison: every `elapsed_s` and the notes' wall-clock time ("traced in 1.43 s on fake
tensors").

    python -m benchmarks.json_identity dump /tmp/after       # on the code after the change
    cd ../before-tree && PYTHONPATH=. python /path/to/benchmarks/json_identity.py dump /tmp/before  # the code before
    python -m benchmarks.json_identity compare /tmp/before /tmp/after
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRACED_IN = re.compile(r"traced in [0-9.]+ s")
DATA = ROOT / "tests" / "data"
MLP = str(ROOT / "resources" / "templates" / "mlp.json")
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "intermediate_size": 344, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 1000, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def cases(hf: str) -> dict[str, list[str]]:
    """Case name → CLI arguments (`hf`: a tiny Llama's config.json)."""
    small = ["--seq-len", "64", "--batch-size", "2"]
    return {
        "mlp_train": ["estimate", MLP, "--batch-size", "32", "--optimizer", "adamw"],
        "hf_generate": ["estimate", hf, "--mode", "generate", "--prompt-len", "32", "--new-tokens", "4",
                        "--batch-size", "1"],
        "hf_generate_gpu": ["estimate", hf, "--mode", "generate", "--prompt-len", "32", "--new-tokens", "4",
                            "--batch-size", "2", "--do-sample", "--top-k", "5", "--cache", "static", "--gpu", "H100"],
        "sharded_fsdp": ["estimate", hf, *small, "--world-size", "4", "--strategy", "fsdp", "--gpu", "A100 80GB"],
        "sharded_zero2_cpu": ["estimate", MLP, "--batch-size", "8", "--world-size", "2", "--strategy", "zero2"],
        "tp_gpu": ["estimate", hf, *small, "--tp", "2", "--world-size", "2", "--gpu", "H100"],
        "hf_lora": ["estimate", hf, *small, "--peft", "lora", "--precision", "bf16"],
        "qlora_gpu": ["estimate", hf, *small, "--peft", "qlora", "--precision", "bf16", "--gpu", "A100 80GB"],
        "resnet_gpu": ["estimate", "resnet18", "--batch-size", "8", "--precision", "amp-bf16", "--checkpointing",
                       "--gpu", "A100 80GB"],
        "open_oom": ["open", str(DATA / "resnet18-b512-oom-at-2gib.pickle.gz")],
        "open_fit": ["open", str(DATA / "resnet18-b8-adam.pickle.gz"), "--model", "resnet18"],
        "open_gpt2": ["open", str(DATA / "gpt2-b4-s512-adamw-ampbf16.pickle.gz")],
        "plan_sharded": ["plan", MLP, "--batch-size", "8", "--world-size", "2", "--strategy", "zero3", "--gpu", "T4"],
        "profile_cpu": ["profile", MLP, "--device", "cpu", "--batch-size", "4", "--compare"],
        "sharded_generate": ["estimate", hf, "--mode", "generate", "--prompt-len", "16", "--new-tokens", "3",
                             "--tp", "2", "--world-size", "2", "--gpu", "H100"],
    }


def _user_step() -> dict[str, Any]:
    import torch
    from torch import nn

    import vramscope

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    est = vramscope.estimate_step(train_step, model, opt, torch.randn(16, 64), torch.randn(16, 64), gpu="A100 80GB")
    return est.to_json()


def dump(out: Path) -> int:
    import main as entry

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "tiny-llama" / "config.json"  # the model is named after its folder: the same in each run
        hf.parent.mkdir()
        hf.write_text(json.dumps(TINY_LLAMA))
        for name, args in cases(str(hf)).items():
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rc = entry.main([*args, "--json"])
            (out / f"{name}.json").write_text(buf.getvalue())
            print(f"{name}: exit {rc}", file=sys.stderr)
    (out / "user_step.json").write_text(json.dumps(_user_step(), indent=2) + "\n")
    (out / "gpu_compare.json").write_text(json.dumps(_gpu_compare_rows(), indent=2, default=str) + "\n")
    (out / "zoo.json").write_text(json.dumps(_zoo_estimates(), indent=2, default=str) + "\n")
    return 0


GPU_COMPARE_CASES = ("lstm", "plain cnn (no BN) fp32", "gpt2 fp32", "bert-base fp32 adam")


def _gpu_compare_rows() -> list[dict[str, Any]]:
    """benchmarks.gpu_compare's rows of a few cases (the H200's figures beside the estimate's), their time left out."""
    from benchmarks import gpu_compare

    rows = []
    for only in GPU_COMPARE_CASES:
        for r in gpu_compare.compare(gpu_compare.DEFAULT, only):
            r.pop("seconds", None)
            rows.append(r)
    return rows


def _zoo_estimates() -> dict[str, Any]:
    """The estimate JSON of every fast case of the CPU zoo, by label."""
    from benchmarks.zoo_models import ZOO
    from engine.planning.estimator import estimate

    return {case.label: estimate(case.source(), case.cfg).to_json() for case in ZOO if case.fast}


def _normalised(text: str) -> str:
    """The document (in its own key order) with what a rerun does not repeat set aside: every `elapsed_s`, and the
    tracing time in the notes."""
    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: (0 if k == "elapsed_s" else walk(x)) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str):
            return TRACED_IN.sub("traced in … s", v)
        return v

    return json.dumps(walk(json.loads(text)), indent=2)


def compare(a: Path, b: Path) -> int:
    differ = 0
    for fa in sorted(a.glob("*.json")):
        fb = b / fa.name
        same = fb.exists() and _normalised(fa.read_text()) == _normalised(fb.read_text())
        differ += not same
        print(f"{fa.stem:<20} {'identical' if same else 'DIFFERS'} ({fa.stat().st_size:,} bytes)")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("dump").add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    return dump(args.out) if args.command == "dump" else compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
