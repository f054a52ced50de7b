"""Hugging Face models from their `config.json` (a file, a folder holding one, or a catalogue name from
resources/hf_configs/), built with transformers' `_from_config` on the meta device: no weights, no network.

The model's inputs follow its task: token ids (with the same ids as labels when training, so `out.loss` is the
next-token loss) for causal language models, pixel values (and class labels) for image classifiers, log-mel
input features with decoder token ids (labels when training) for speech sequence-to-sequence models, token ids and
decoder token ids of the same length (labels when training) for text ones (T5, a BART or Pegasus for conditional
generation).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ..config.train_config import TrainConfig
from ..core.bounded_read import read_json
from ..core.errors import UserError, printable
from ..core.resources import resource_path
from . import moe_routing
from .hf_fields import check_hf_fields
from .source import ModelSource

DEFAULT_SEQ_LEN = 2048  # a causal LM's sequence (or prompt) length when none is given, capped by its context
TASKS = ("causal-lm", "image-classification", "speech-seq2seq", "text-seq2seq", "base")


@dataclass(frozen=True)
class CatalogueEntry:
    """One shipped configuration: resources/hf_configs/<name>.json, described in resources/hf_catalogue.json."""

    name: str
    hf_id: str
    description: str
    published_parameters: int
    path: Path


@functools.lru_cache(maxsize=1)
def hf_catalogue() -> dict[str, CatalogueEntry]:
    index = json.loads(resource_path("hf_catalogue.json").read_text())
    return {
        name: CatalogueEntry(name, e["hf_id"], e["description"], int(e["published_parameters"]),
                             resource_path("hf_configs", f"{name}.json"))
        for name, e in index["models"].items()
    }


def _transformers() -> ModuleType:
    try:
        import transformers
    except ImportError:
        raise UserError("a Hugging Face config needs the 'transformers' package: pip install transformers") from None
    return transformers


def looks_like_hf_config(data: object) -> bool:
    return isinstance(data, dict) and isinstance(data.get("model_type"), str)


class HFConfigSource(ModelSource):
    """A model transformers builds from a configuration dict; `where` names it in messages."""

    kind = "hf-config"

    def __init__(self, data: dict[str, Any], name: str, where: str, entry: CatalogueEntry | None = None):
        self.name = name
        self.where = where
        self.entry = entry
        if not looks_like_hf_config(data):
            raise UserError(f"'{where}' is not a Hugging Face config: it has no \"model_type\" field")
        check_hf_fields(data, where)  # the sizes the engine relies on, each named when it is wrong
        tf = _transformers()
        fields = dict(data)
        model_type = fields.pop("model_type")
        try:
            self.hf_config = tf.AutoConfig.for_model(model_type, **fields)
        except Exception as e:  # noqa: BLE001 - transformers' and huggingface_hub's validators raise their own types
            if isinstance(e, ValueError) and "Unrecognized model identifier" in str(e):
                raise UserError(f"'{where}': model_type '{model_type}' is unknown to transformers "
                                f"{tf.__version__}; upgrade transformers or check the config") from None
            # their words (which name the field), on one line; not the exception's class
            reason = re.sub(r"\b[A-Z]\w*(Error|Exception): ", "", " ".join(str(e).split()))[:200]
            reason = reason or "it cannot be built"
            raise UserError(f"'{where}': transformers rejects the config: {printable(reason, 200)}") from None
        self.model_class: Any = self._model_class(tf)  # a transformers PreTrainedModel class
        self.task = _task_of(self.model_class.__name__, self.hf_config)
        self.moe = moe_routing.is_moe(self.model_class)
        # what the config asks for, read before a build sets it (transformers writes the choice into the config)
        self._experts_requested: str | None = self.hf_config._experts_implementation if self.moe else None

    @classmethod
    def from_path(cls, path: str | Path) -> HFConfigSource:
        p = Path(path)
        if p.is_dir():
            if not (p / "config.json").is_file():
                raise UserError(f"folder '{p}' holds no config.json; give a Hugging Face model folder or config file")
            p = p / "config.json"
        if not p.exists():
            raise UserError(f"config file '{p}' not found")
        data = read_json(p, what="Hugging Face config")
        name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
        return cls(data, name, str(p))

    @classmethod
    def from_catalogue(cls, entry: CatalogueEntry) -> HFConfigSource:
        return cls(json.loads(entry.path.read_text()), entry.name, entry.name, entry)

    def _model_class(self, tf: ModuleType) -> type[nn.Module]:
        for arch in getattr(self.hf_config, "architectures", None) or ():
            found = getattr(tf, str(arch), None)
            if isinstance(found, type) and issubclass(found, nn.Module):
                return found
        for auto in ("AutoModelForCausalLM", "AutoModelForSpeechSeq2Seq", "AutoModelForSeq2SeqLM",
                     "AutoModelForImageClassification", "AutoModel"):
            mapping = getattr(tf, auto)._model_mapping
            if type(self.hf_config) in mapping:
                model_class: type[nn.Module] = mapping[type(self.hf_config)]
                return model_class
        raise UserError(f"'{self.where}': transformers has no model class for model_type "
                        f"'{self.hf_config.model_type}'")

    @property
    def family(self) -> str:
        return {"causal-lm": "text", "text-seq2seq": "text", "base": "text",
                "image-classification": "vision"}.get(self.task, "speech")

    def experts_implementation(self, cfg: TrainConfig) -> str:
        """The experts a mixture-of-experts model runs: its config's choice, else transformers' default."""
        return moe_routing.implementation(self._experts_requested, cfg.moe_routing)

    def default_seq_len(self) -> int:
        c = self.hf_config
        if self.task == "speech-seq2seq":
            return int(getattr(c, "max_target_positions", 448))
        ctx = getattr(c, "max_position_embeddings", None)
        return min(DEFAULT_SEQ_LEN, int(ctx)) if ctx else DEFAULT_SEQ_LEN

    def context_limit(self) -> int | None:
        """The longest sequence the model's positions allow (None when unbounded or unknown)."""
        c = self.hf_config
        ctx = getattr(c, "max_target_positions" if self.task == "speech-seq2seq" else "max_position_embeddings", None)
        return int(ctx) if ctx else None

    def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
        # fp32 weights: the configuration's own dtype (often bfloat16) is not what --precision asks for.
        kw: dict[str, Any] = {"dtype": torch.float32}
        if self.moe:
            moe_routing.register()
            kw["experts_implementation"] = self.experts_implementation(cfg)
        model = self.model_class._from_config(self.hf_config, **kw)
        return model, self.inputs(cfg)

    def inputs(self, cfg: TrainConfig) -> dict[str, torch.Tensor]:
        c = self.hf_config
        b = cfg.batch_size
        if cfg.generating and self.task != "causal-lm":
            raise UserError(f"'{self.name}' is a {self.task} model: --mode generate needs a causal language model")
        if self.task == "image-classification":
            vc = getattr(c, "vision_config", None) or c  # (CLIP, SigLIP: the image tower's own config holds them)
            own = int(getattr(vc, "image_size", 224))
            size = cfg.image_size or own
            x: dict[str, Any] = {"pixel_values": torch.zeros(b, int(getattr(vc, "num_channels", 3)), size, size)}
            if size != own:
                x["interpolate_pos_encoding"] = True
            if cfg.training:
                x["labels"] = torch.zeros(b, dtype=torch.long)
            return x
        seq = cfg.seq_len or self.default_seq_len()
        if cfg.generating:
            seq = cfg.prompt_len or cfg.seq_len or self.default_seq_len()
        ids = torch.zeros(b, seq, dtype=torch.long)
        if self.task == "speech-seq2seq":
            frames = 2 * int(c.max_source_positions)  # Whisper's encoder takes exactly 30 s of 10 ms frames
            feats = torch.zeros(b, int(c.num_mel_bins), frames)
            return {"input_features": feats, ("labels" if cfg.training else "decoder_input_ids"): ids}
        if self.task == "causal-lm" and cfg.training:
            return {"input_ids": ids, "labels": ids}
        if self.task == "text-seq2seq":  # the decoder reads target ids of the same length (labels when training)
            return {"input_ids": ids, ("labels" if cfg.training else "decoder_input_ids"): ids}
        if cfg.generating and cfg.generate_program == "generate":  # the prompt as a tokenizer returns it
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        return {"input_ids": ids}

    def describe(self) -> str:
        what = f"{self.entry.description}, {self.entry.hf_id}" if self.entry else f"from {self.where}"
        return f"{self.name}: {self.model_class.__name__} ({what})"


def _task_of(class_name: str, config: Any) -> str:
    if class_name.endswith("ForCausalLM"):
        return "causal-lm"
    if class_name.endswith("ForImageClassification"):
        return "image-classification"
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "num_mel_bins", None):
        return "speech-seq2seq"
    if getattr(config, "is_encoder_decoder", False) and class_name.endswith("ForConditionalGeneration"):
        return "text-seq2seq"  # T5, BART, Pegasus, mBART: an encoder and a decoder over token ids
    return "base"
