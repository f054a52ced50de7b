"""VGG-16 (configuration D, no batch norm) in plain torch.nn, shaped exactly like torchvision's vgg16."""

from __future__ import annotations

import torch
from torch import nn

from .inputs import check_image_size, images, tensor

# Output channels of the 3x3 convolutions of each stage; a 2x2 max-pool closes every stage.
_VGG16_STAGES = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]


class VGGStage(nn.Module):
    """3x3 conv + ReLU, repeated, then a 2x2 max-pool."""

    def __init__(self, in_channels: int, widths: list[int]):
        super().__init__()
        layers: list[nn.Module] = []
        for width in widths:
            layers += [nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(inplace=True)]
            in_channels = width
        layers.append(nn.MaxPool2d(2, 2))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tensor(self.layers(x))


class VGG(nn.Module):
    def __init__(self, stages: list[list[int]], num_classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        blocks, channels = [], 3
        for widths in stages:
            blocks.append(VGGStage(channels, widths))
            channels = widths[-1]
        self.features = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(channels * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tensor(self.classifier(torch.flatten(self.avgpool(self.features(x)), 1)))


def build_vgg16(batch_size: int, seq_len: int | None = None, image_size: int | None = None) -> tuple[VGG, torch.Tensor]:
    size = check_image_size("vgg16", image_size, default=224, minimum=32)
    return VGG(_VGG16_STAGES), images(batch_size, 3, size)
