"""The Python API's keyword options: the CLI's options under their field names (`optimizer="adamw"`,
`precision="amp-bf16"`, `gpu="H100"`, `peft="lora"`, …) with the CLI's values and defaults, into a TrainConfig."""

from __future__ import annotations

import difflib
from dataclasses import fields
from typing import Any

from engine.config.train_config import TrainConfig
from engine.core.errors import UserError

# Set by what the API is given, not by a keyword: the batch is the inputs' first dimension, and the inputs' shapes
# are the sequence length and image size.
IMPLIED = {"batch_size": "the inputs' first dimension", "seq_len": "the inputs' shapes",
           "image_size": "the inputs' shapes"}
OPTIONS = tuple(f.name for f in fields(TrainConfig) if f.name not in IMPLIED)
_TRAINING_ONLY = ("optimizer", "grad_accum", "checkpointing", "fused")


def config_from_options(batch_size: int, options: dict[str, Any], *, call: str,
                        own: tuple[str, ...] = ()) -> TrainConfig:
    """The configuration `options` name, for a batch of `batch_size`. `call` names the function in messages;
    `own`: options that function decides itself (refused as keywords, as the implied ones are)."""
    for key, value in options.items():
        if key in IMPLIED:
            raise UserError(f"{call}: {key}={value!r} is not an option: it is {IMPLIED[key]}")
        if key in own or key not in OPTIONS:
            allowed = [o for o in OPTIONS if o not in own]
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            reason = "is set by the step itself" if key in own else "is not an option"
            raise UserError(f"{call}: {key}= {reason}{hint}; options: {', '.join(allowed)}")
    mode = options.get("mode", "train")
    if mode != "train":
        given = [k for k in _TRAINING_ONLY if options.get(k) not in (None, False)]
        if given:
            raise UserError(f"{call}: {', '.join(given)} only appl{'y' if len(given) > 1 else 'ies'} to training; "
                            f"drop {'them' if len(given) > 1 else 'it'} or use mode='train'")
    if options.get("gpu") is not None and options.get("device") == "cpu":
        raise UserError(f"{call}: gpu={options['gpu']!r} asks for a GPU verdict, which device='cpu' has none of; "
                        "drop one of them")
    return TrainConfig.from_options({**{k: v for k, v in options.items() if v is not None}, "batch_size": batch_size})
