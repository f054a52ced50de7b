"""ViT-B/16 in plain torch.nn, with torchvision's vit_b_16 parameter shapes (attention via SDPA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...parallel.tensor_parallel import AttentionHeads
from .inputs import check_image_size, images, tensor


class SelfAttention(AttentionHeads):
    """Multi-head self-attention; one packed qkv projection, as nn.MultiheadAttention's in_proj."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = self.kv_heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return tensor(self.out_proj(y.transpose(1, 2).reshape(b, n, d)))


class EncoderBlock(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int, heads: int, mlp_dim: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = SelfAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attention(self.ln_1(x))
        return tensor(x + self.mlp(self.ln_2(x)))


class VisionTransformer(nn.Module):
    def __init__(self, image_size: int = 224, patch_size: int = 16, layers: int = 12, heads: int = 12,
                 dim: int = 768, mlp_dim: int = 3072, num_classes: int = 1000):
        super().__init__()
        self.patch_size = patch_size
        self.conv_proj = nn.Conv2d(3, dim, patch_size, patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        # One learned position per patch plus the class token: the parameter count depends on the image size.
        self.pos_embedding = nn.Parameter(torch.empty(1, (image_size // patch_size) ** 2 + 1, dim).normal_(std=0.02))
        self.layers = nn.Sequential(*[EncoderBlock(dim, heads, mlp_dim) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.ln(self.layers(x + self.pos_embedding))
        return tensor(self.head(x[:, 0]))


def build_vit_b16(batch_size: int, seq_len: int | None = None, image_size: int | None = None
                  ) -> tuple[VisionTransformer, torch.Tensor]:
    size = check_image_size("vit-b16", image_size, default=224, minimum=16, multiple=16)
    return VisionTransformer(image_size=size), images(batch_size, 3, size)
