"""`vramscope.estimate(model, inputs, **options)`: the CLI's estimate of a model object the user holds, and
`vramscope.fake()`, where a model of any size is built without taking memory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from engine.models.object_source import ObjectSource, batch_of
from engine.planning.estimator import estimate as engine_estimate
from engine.results.types import Estimate

from .options import config_from_options


def estimate(model: nn.Module, inputs: Any, **options: Any) -> Estimate:
    """The peak memory of a training step (or inference pass) of `model` called on `inputs`, traced on fake tensors:
    the Estimate `vramscope estimate` computes, with the CLI's options as keywords and the CLI's values
    (`optimizer="adamw"`, `precision="amp-bf16"`, `mode="inference"`, `gpu="H100"`, `peft="lora"`,
    `checkpointing=True`, `grad_accum=4`, `device="cpu"`, …). The batch size is the inputs' first dimension.

    `model` may hold real weights, be built on the meta device, or under `vramscope.fake()`; `inputs` is a tensor,
    a tuple of arguments or a dict of keyword arguments. Neither is changed. The loss is the output's `.loss`, else
    the sum of its first tensor (for your own loss, optimizers and loop, see `vramscope.estimate_step`).
    Raises engine.core.errors.UserError (one line naming the option or the model's failing module) for what can be
    fixed.
    """
    source = ObjectSource(model, inputs)
    cfg = config_from_options(batch_of(source.inputs), options, call="vramscope.estimate")
    return engine_estimate(source, cfg)


@contextmanager
def fake() -> Iterator[None]:
    """Build models inside without memory: their parameters and buffers are made on PyTorch's meta device (shapes
    and dtypes, no values), so `with vramscope.fake(): model = Llama(config)` takes no RAM for 70 B parameters.
    Pass the model to `estimate` or `estimate_step`. Code that reads weight values while building fails here."""
    with torch.device("meta"):
        yield
