"""The classic U-Net of Ronneberger, Fischer & Brox (MICCAI 2015, arXiv:1505.04597, fig. 1) in plain torch.nn.

As in the paper: 1 input channel, 2 output classes, two 3x3 conv + ReLU per level with 64, 128, 256, 512,
1024 channels, 2x2 max-pool down, 2x2 transposed-conv up (halving channels), skip connections
concatenated, a final 1x1 conv; no batch norm. One change, the usual one: the 3x3 convs are padded so the
output has the input's size (no cropping of the skips), which leaves the parameter count unchanged at
31,030,658 (derived layer by layer from the paper's figure; see tests/test_templates.py).
"""

from __future__ import annotations

import torch
from torch import nn

from .inputs import check_image_size, images, tensor

WIDTHS = (64, 128, 256, 512, 1024)


class DoubleConv(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tensor(self.layers(x))


class Up(nn.Module):
    """2x2 up-convolution halving the channels, concatenation with the skip, then a DoubleConv."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cout, 2, stride=2)
        self.conv = DoubleConv(2 * cout, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return tensor(self.conv(torch.cat([skip, self.up(x)], dim=1)))


class UNet(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 2):
        super().__init__()
        chans = (in_channels,) + WIDTHS
        self.down = nn.ModuleList(DoubleConv(chans[i], chans[i + 1]) for i in range(len(WIDTHS)))
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList(Up(WIDTHS[i], WIDTHS[i - 1]) for i in range(len(WIDTHS) - 1, 0, -1))
        self.head = nn.Conv2d(WIDTHS[0], num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, level in enumerate(self.down):
            x = level(x if i == 0 else self.pool(x))
            skips.append(x)
        skips.pop()  # the bottom level feeds the up path directly
        for up in self.up:
            x = up(x, skips.pop())
        return tensor(self.head(x))


IN_CHANNELS = 1


def build_unet(batch_size: int, seq_len: int | None = None, image_size: int | None = None) -> tuple[UNet, torch.Tensor]:
    # Four 2x2 poolings: the size must divide by 16 so the skips line up with the up path.
    size = check_image_size("unet", image_size, default=256, minimum=16, multiple=16)
    return UNet(IN_CHANNELS), images(batch_size, IN_CHANNELS, size)
