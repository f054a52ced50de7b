"""Model sources: template names, sketches and `file.py:function` resolve and build; every bad input is a
one-line UserError that names the problem and its place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.models.sources import FileSource, ModelSource, SketchSource, TemplateSource, resolve_source

FIXTURES = Path(__file__).parent / "fixtures"
USER = FIXTURES / "user_models.py"


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def user_error(ref: str, build: bool = False) -> str:
    with pytest.raises(UserError) as err:
        src = resolve_source(ref)
        if build:
            src.build(TrainConfig(batch_size=2))
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


@pytest.mark.parametrize("ref, name", [
    ("resnet18", "resnet18"), ("ResNet50", "resnet50"), ("VIT_B16", "vit-b16"), ("vit-b16", "vit-b16"),
    ("mobilenet-v2", "mobilenet_v2"), ("llama_7b", "llama-7b"), ("LSTM-LM", "lstm-lm"), (" gpt2 ", "gpt2"),
])
def test_template_names_resolve_in_any_spelling(ref, name):
    src = resolve_source(ref)
    assert isinstance(src, TemplateSource) and isinstance(src, ModelSource)
    assert src.kind == "template" and src.name == name
    assert name in src.describe()


def test_template_build_follows_the_config():
    src = resolve_source("gpt2")
    with torch.device("meta"):
        model, inputs = src.build(TrainConfig(batch_size=3, seq_len=64))
    assert inputs["input_ids"].shape == (3, 64) and inputs["input_ids"].device.type == "meta"
    assert sum(p.numel() for p in model.parameters()) == 124_439_808  # HF GPT2LMHeadModel, tied head
    with torch.device("meta"):
        _, x = resolve_source("resnet18").build(TrainConfig(batch_size=5, image_size=112))
    assert x.shape == (5, 3, 112, 112)


def test_file_source_returning_a_tensor_builds_on_meta_and_for_real():
    src = resolve_source(f"{USER}:small_cnn")
    assert isinstance(src, FileSource) and src.kind == "file" and src.name == "user_models.py:small_cnn"
    with torch.device("meta"):
        model, x = src.build(TrainConfig(batch_size=4))
    assert x.device.type == "meta" and x.shape == (4, 3, 32, 32)
    model, x = src.build(TrainConfig(batch_size=4))
    assert model(x).shape == (4, 10)
    # 3x3 conv 3->8 with bias (224) + BatchNorm (16) + Linear 8->10 (90)
    assert sum(p.numel() for p in model.parameters()) == 224 + 16 + 90


@pytest.mark.parametrize("function", ["dict_inputs", "tuple_inputs"])
def test_file_source_with_several_inputs(function):
    model, inputs = resolve_source(f"{USER}:{function}").build(TrainConfig(batch_size=3))
    out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    assert out.shape == (3, 4)


class FakeSketch:
    """What the GUI hands SketchSource: an engine.sketch.document.Sketch-like object."""

    name = "my-net"

    def to_module(self):
        return nn.Linear(8, 2)

    def example_inputs(self, batch_size):
        return torch.randn(batch_size, 8)


def test_sketch_source_in_memory():
    src = SketchSource(FakeSketch())
    assert src.kind == "sketch" and src.name == "my-net"
    with torch.device("meta"):
        model, x = src.build(TrainConfig(batch_size=6))
    assert x.shape == (6, 8) and model.weight.device.type == "meta"


def test_sketch_json_resolves_through_engine_sketch(tmp_path):
    saved = Path(__file__).parent.parent / "resources" / "templates" / "mlp.json"
    if saved.is_file():
        src = resolve_source(str(saved))
        assert src.kind == "sketch" and isinstance(src, SketchSource)
        model, x = src.build(TrainConfig(batch_size=3))
        assert isinstance(model, nn.Module) and x.shape[0] == 3 and model(x).shape[0] == 3
    bad = tmp_path / "garbage.json"
    bad.write_text("{ not json")
    with pytest.raises(UserError) as err:
        resolve_source(str(bad))
    assert "\n" not in str(err.value)


# --- Bad input ---------------------------------------------------------------------------------------------


def test_missing_files():
    assert "not found" in user_error("nowhere/model.py:build") and "nowhere/model.py" in user_error(
        "nowhere/model.py:build")
    assert "not found" in user_error("nowhere/net.json") and "nowhere/net.json" in user_error("nowhere/net.json")


def test_unknown_template_suggests_close_names():
    msg = user_error("resnet19")
    assert "unknown template 'resnet19'" in msg and "'resnet18'" in msg
    assert "'llama-7b'" in user_error("lama-7b")


def test_unknown_function_suggests_close_names():
    msg = user_error(f"{USER}:small_cn")
    assert "'small_cn'" in msg and "'small_cnn'" in msg and "user_models.py" in msg
    msg = user_error(f"{USER}:zzz")
    assert "functions defined there" in msg and "small_cnn" in msg


def test_python_file_without_function():
    assert "names no function" in user_error(str(USER))
    assert "names no function" in user_error(f"{USER}:")


def test_user_code_raising_names_the_users_file_and_line():
    msg = user_error(f"{USER}:raises", build=True)
    line = line_of(USER, 'raise ValueError(f"width must be positive')
    assert f"user_models.py:{line}" in msg
    assert "ValueError: width must be positive, got 0" in msg


def test_user_file_raising_on_import_names_its_line():
    path = FIXTURES / "broken_import.py"
    msg = user_error(f"{path}:model")
    assert f"broken_import.py:{line_of(path, 'SIZES[')}" in msg and "KeyError" in msg and "'large'" in msg


def test_user_file_with_a_syntax_error(tmp_path):
    path = tmp_path / "typo.py"
    path.write_text("import torch\n\ndef model(batch_size)\n    return None\n")
    msg = user_error(f"{path}:model")
    assert "typo.py:3" in msg and "SyntaxError" in msg


@pytest.mark.parametrize("function, words", [
    ("wrong_return", "must return (model, inputs); it returned Linear"),
    ("wrong_model", "model an nn.Module; got str"),
])
def test_bad_return_values(function, words):
    assert words in user_error(f"{USER}:{function}", build=True)
