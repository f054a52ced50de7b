"""The Python API's public surface is `vramscope.__all__`, typed and documented, and the README's example of it
runs as written."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import vramscope

README = Path(__file__).resolve().parent.parent / "README.md"
PUBLIC = ["Estimate", "EstimateDiff", "UserError", "__version__", "diff", "estimate", "estimate_step", "fake",
          "record", "testing"]


def test_all_is_the_public_surface_and_every_name_is_documented_and_typed():
    assert sorted(vramscope.__all__) == sorted(PUBLIC)
    namespace: dict[str, object] = {}
    exec("from vramscope import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(PUBLIC)
    for name in PUBLIC:
        obj = getattr(vramscope, name)
        if name == "__version__":
            assert isinstance(obj, str)
            continue
        assert inspect.getdoc(obj), f"{name} has no docstring"
        if inspect.isfunction(obj):
            sig = inspect.signature(obj)
            assert sig.return_annotation is not inspect.Signature.empty, name
            assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()), name
    assert inspect.getdoc(vramscope.testing.assert_peak_within)


def _section_code() -> list[str]:
    text = README.read_text(encoding="utf-8")
    start = text.index("## In your own code")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], re.S)


def test_the_readmes_example_runs_and_gives_what_it_says(capsys):
    example = _section_code()[0]
    namespace: dict[str, object] = {}
    exec(compile(example, "README.md", "exec"), namespace)
    est, big, step = (namespace[k] for k in ("est", "big_est", "step_est"))
    assert isinstance(est, vramscope.Estimate) and est.config.precision == "amp-bf16" and est.gpu is not None
    assert isinstance(big, vramscope.Estimate) and big.parameters == 48 * (8192 * 8192 + 8192)
    assert big.gpu is not None and big.gpu.verdict == "fits"
    assert isinstance(step, vramscope.Estimate) and step.step.optimizers == (
        "body_opt (AdamW)", "head_opt (SGD)") and step.config.precision == "amp-bf16"
    out = capsys.readouterr().out
    assert "peak" in out and "Configuration:" in out
