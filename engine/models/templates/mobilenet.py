"""MobileNetV2 (width 1.0) in plain torch.nn, shaped exactly like torchvision's mobilenet_v2."""

from __future__ import annotations

import torch
from torch import nn

from .inputs import check_image_size, images, tensor

# (expansion t, output channels c, repeats n, first stride s) from Sandler et al. 2018, table 2.
_SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def conv_bn_relu6(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """1x1 expand (skipped when t == 1), 3x3 depthwise, 1x1 linear projection; residual when shapes agree."""

    def __init__(self, cin: int, cout: int, stride: int, expand_ratio: int):
        super().__init__()
        hidden = cin * expand_ratio
        self.use_residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(conv_bn_relu6(cin, hidden, 1))
        layers += [
            conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tensor(x + self.conv(x) if self.use_residual else self.conv(x))


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, dropout: float = 0.2):
        super().__init__()
        self.stem = conv_bn_relu6(3, 32, 3, 2)
        blocks, channels = [], 32
        for t, c, n, s in _SETTINGS:
            for i in range(n):
                blocks.append(InvertedResidual(channels, c, s if i == 0 else 1, t))
                channels = c
        # All 17 inverted residuals in one container of a single type (torchvision mixes them into `features`).
        self.blocks = nn.Sequential(*blocks)
        self.head = conv_bn_relu6(channels, 1280, 1)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.blocks(self.stem(x)))
        x = nn.functional.adaptive_avg_pool2d(x, 1)
        return tensor(self.classifier(torch.flatten(x, 1)))


def build_mobilenet_v2(batch_size: int, seq_len: int | None = None, image_size: int | None = None
                       ) -> tuple[MobileNetV2, torch.Tensor]:
    size = check_image_size("mobilenet_v2", image_size, default=224, minimum=32)
    return MobileNetV2(), images(batch_size, 3, size)
