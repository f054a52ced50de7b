"""One colour per memory category (engine.results.types.ALL_CATEGORIES) and the chart themes for light and dark
palettes.

The hex tables are plain strings so the HTML report can use them without a painter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from PySide6.QtGui import QColor, QPalette

from engine.results.types import ALL_CATEGORIES

# Okabe–Ito based, so neighbours in the stack stay distinguishable for colour-blind readers.
CATEGORY_COLORS: dict[str, str] = {
    "parameters": "#0072B2",
    "adapter_weights": "#004C7A",
    "buffers": "#56B4E9",
    "gradients": "#E69F00",
    "optimizer_state": "#CC79A7",
    "activations": "#009E73",
    "kv_cache": "#882255",
    "temporaries": "#F0E442",
    "inputs": "#D55E00",
    "allocator_overhead": "#8C8C8C",
    "cuda_context": "#5D4A9C",
    "workspace": "#A6761D",
}
# Lighter variants of the same hues: the dark theme draws them on a near-black background.
CATEGORY_COLORS_DARK: dict[str, str] = {
    "parameters": "#4DA3E0",
    "adapter_weights": "#A9D4F2",
    "buffers": "#8FD0F5",
    "gradients": "#F5B841",
    "optimizer_state": "#E3A3CB",
    "activations": "#3CC79B",
    "kv_cache": "#D16BA5",
    "temporaries": "#F5EC7A",
    "inputs": "#F08A4B",
    "allocator_overhead": "#B0B0B0",
    "cuda_context": "#9C8AD6",
    "workspace": "#D4A24C",
}
CATEGORY_LABELS: dict[str, str] = {
    "parameters": "Parameters",
    "adapter_weights": "Adapter weights",
    "buffers": "Buffers",
    "gradients": "Gradients",
    "optimizer_state": "Optimizer state",
    "activations": "Activations",
    "kv_cache": "KV cache",
    "temporaries": "Temporaries",
    "inputs": "Inputs",
    "allocator_overhead": "Allocator cache (reserved, not allocated)",
    "cuda_context": "CUDA context",
    "workspace": "Workspaces",
}
# What each category is, in a sentence: the report's method section and the app's tooltips.
CATEGORY_MEANINGS: dict[str, str] = {
    "parameters": "the model's weights and biases (with LoRA/QLoRA: the frozen base, packed with its quantization "
    "state when quantized)",
    "adapter_weights": "the trained LoRA adapters; with LoRA/QLoRA the gradients and optimizer state are theirs alone",
    "buffers": "non-trainable state such as BatchNorm running statistics",
    "gradients": "one gradient per trainable parameter, alive from backward until zero_grad",
    "optimizer_state": "the optimizer's per-parameter state (e.g. Adam's two moments)",
    "activations": "forward outputs saved for backward (in inference: still alive when the forward ends)",
    "kv_cache": "the attention keys and values generation keeps for every token so far (transformers' KV cache)",
    "temporaries": "short-lived intermediates and kernel workspaces freed within an op or phase",
    "inputs": "the batch, targets and the loss",
    "allocator_overhead": "memory PyTorch's caching allocator holds in its cache: reserved from the GPU "
    "(torch.cuda.memory_reserved) but not allocated to a tensor at that moment — freed blocks kept for reuse, "
    "the rounding of each request and the unused rest of split segments. nvidia-smi counts it as used; it is not "
    "lost: later allocations reuse it, and torch.cuda.empty_cache() hands it back",
    "cuda_context": "the CUDA context itself (kernels, runtime), outside PyTorch's allocator",
    "workspace": "cuBLAS / cuDNN library workspaces",
}
_FALLBACK = ("#7F7F7F", "#A0A0A0")

assert (set(CATEGORY_COLORS) == set(ALL_CATEGORIES) == set(CATEGORY_COLORS_DARK) == set(CATEGORY_LABELS)
        == set(CATEGORY_MEANINGS))


def category_hex(category: str, dark: bool = False) -> str:
    table = CATEGORY_COLORS_DARK if dark else CATEGORY_COLORS
    return table.get(category, _FALLBACK[dark])


def category_color(category: str, dark: bool = False) -> QColor:
    return QColor(category_hex(category, dark))


# With LoRA/QLoRA the parameters are the frozen base, and gradients and optimizer state the adapters' alone.
PEFT_LABELS = {"parameters": "Base weights", "gradients": "Adapter gradients",
               "optimizer_state": "Adapter opt. state"}


def category_label(category: str, peft: bool = False) -> str:
    if peft and category in PEFT_LABELS:
        return PEFT_LABELS[category]
    return CATEGORY_LABELS.get(category, category.replace("_", " ").capitalize())


def category_meaning(category: str) -> str:
    return CATEGORY_MEANINGS.get(category, "")


def ordered_categories(keys: Iterable[str]) -> list[str]:
    """Known categories in stacking order first, then any unknown ones alphabetically."""
    present = set(keys)
    return [c for c in ALL_CATEGORIES if c in present] + sorted(present - set(ALL_CATEGORIES))


ThemeColour = Literal["background", "foreground", "muted", "grid", "peak", "measured", "reserved"]


@dataclass(frozen=True)
class ChartTheme:
    dark: bool
    background: str
    foreground: str
    muted: str  # axis labels, grid text
    grid: str
    phase_tint: dict[str, str]  # phase -> band colour (with alpha)
    peak: str
    measured: str
    reserved: str

    def color(self, name: ThemeColour) -> QColor:
        return QColor({
            "background": self.background,
            "foreground": self.foreground,
            "muted": self.muted,
            "grid": self.grid,
            "peak": self.peak,
            "measured": self.measured,
            "reserved": self.reserved,
        }[name])

    def category(self, category: str) -> QColor:
        return category_color(category, self.dark)


LIGHT = ChartTheme(
    dark=False,
    background="#FFFFFF",
    foreground="#1E1E1E",
    muted="#5A5A5A",
    grid="#DDDDDD",
    phase_tint={"setup": "#F2F2F2", "forward": "#E8F1FA", "backward": "#FBEFE3", "optimizer": "#EAF6EE",
                "prefill": "#E8F1FA", "decode": "#F3ECF7"},
    peak="#C0392B",
    measured="#000000",
    reserved="#444444",
)
DARK = ChartTheme(
    dark=True,
    background="#1E1F22",
    foreground="#E6E6E6",
    muted="#A8A8A8",
    grid="#3A3B3F",
    phase_tint={"setup": "#2A2B2E", "forward": "#1F2A36", "backward": "#36291F", "optimizer": "#1F3326",
                "prefill": "#1F2A36", "decode": "#2E2236"},
    peak="#FF6B5A",
    measured="#FFFFFF",
    reserved="#BBBBBB",
)


def is_dark_palette(palette: QPalette) -> bool:
    """The one "is this palette dark?" rule: the window colour is darker than its text (system dark mode)."""
    window = palette.color(QPalette.ColorRole.Window)
    text = palette.color(QPalette.ColorRole.WindowText)
    return window.lightnessF() < text.lightnessF()


def theme_for_palette(palette: QPalette) -> ChartTheme:
    """DARK for a dark palette (is_dark_palette), else LIGHT."""
    return DARK if is_dark_palette(palette) else LIGHT
