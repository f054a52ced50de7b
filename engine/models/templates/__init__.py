"""The built-in model templates: their registry (name -> TemplateInfo) and how each one is built.

Every template is plain torch.nn, builds cheaply inside `with torch.device("meta"):` and has exactly the
parameter count of its reference implementation (reference_parameters, at the default sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import bert, gpt2, llama, resnet
from .inputs import BuildFn
from .lstm_lm import build_lstm_lm
from .mobilenet import build_mobilenet_v2
from .unet import build_unet
from .vgg import build_vgg16
from .vit import build_vit_b16

__all__ = ["TEMPLATES", "BuildFn", "TemplateInfo"]


@dataclass(frozen=True)
class TemplateInfo:
    name: str
    family: str  # "vision" | "text"
    description: str
    reference_parameters: int
    default_seq_len: int | None
    default_image_size: int | None
    build: BuildFn


def _vision(name: str, description: str, params: int, build: BuildFn, image_size: int = 224) -> TemplateInfo:
    return TemplateInfo(name, "vision", description, params, None, image_size, build)


def _text(name: str, description: str, params: int, build: BuildFn, seq_len: int) -> TemplateInfo:
    return TemplateInfo(name, "text", description, params, seq_len, None, build)


_ALL = [
    _vision("resnet18", "ResNet-18, torchvision's resnet18 (ImageNet, 1000 classes)", 11_689_512, resnet.builder(18)),
    _vision("resnet34", "ResNet-34, torchvision's resnet34", 21_797_672, resnet.builder(34)),
    _vision("resnet50", "ResNet-50 (v1.5), torchvision's resnet50", 25_557_032, resnet.builder(50)),
    _vision("resnet101", "ResNet-101 (v1.5), torchvision's resnet101", 44_549_160, resnet.builder(101)),
    _vision("resnet152", "ResNet-152 (v1.5), torchvision's resnet152", 60_192_808, resnet.builder(152)),
    _vision("vgg16", "VGG-16 without batch norm, torchvision's vgg16", 138_357_544, build_vgg16),
    _vision("mobilenet_v2", "MobileNetV2 (width 1.0), torchvision's mobilenet_v2", 3_504_872, build_mobilenet_v2),
    _vision("vit-b16", "ViT-B/16, torchvision's vit_b_16 (positions for 224x224 images)", 86_567_656, build_vit_b16),
    _text("bert-base", "BERT-base encoder with pooler, HF BertModel (bert-base-uncased)", 109_482_240,
          bert.builder(bert.BERT_BASE, "bert-base"), 512),
    _text("bert-large", "BERT-large encoder with pooler, HF BertModel (bert-large-uncased)", 335_141_888,
          bert.builder(bert.BERT_LARGE, "bert-large"), 512),
    _text("gpt2", "GPT-2 124M with tied LM head, HF GPT2LMHeadModel; trains on next-token loss", 124_439_808,
          gpt2.builder(gpt2.GPT2_SMALL, "gpt2"), 1024),
    _text("gpt2-medium", "GPT-2 medium 355M with tied LM head, HF GPT2LMHeadModel", 354_823_168,
          gpt2.builder(gpt2.GPT2_MEDIUM, "gpt2-medium"), 1024),
    _text("llama-7b", "LLaMA-2 7B, HF LlamaForCausalLM; trains on next-token loss", 6_738_415_616,
          llama.builder(llama.LLAMA2_7B, "llama-7b"), 2048),
    _text("llama-13b", "LLaMA-2 13B, HF LlamaForCausalLM", 13_015_864_320,
          llama.builder(llama.LLAMA2_13B, "llama-13b"), 2048),
    _text("llama-70b", "LLaMA-2 70B (8 grouped KV heads), HF LlamaForCausalLM", 68_976_648_192,
          llama.builder(llama.LLAMA2_70B, "llama-70b"), 2048),
    _vision("unet", "U-Net of Ronneberger et al. 2015 (1 channel in, 2 classes, padded convs)", 31_030_658,
            build_unet, image_size=256),
    _text("lstm-lm", "2-layer LSTM LM, PyTorch's word_language_model defaults on WikiText-2", 13_987_678,
          build_lstm_lm, 35),
]

TEMPLATES: dict[str, TemplateInfo] = {t.name: t for t in _ALL}
