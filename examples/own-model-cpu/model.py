"""A data scientist's own network, not one of modak's zoo architectures: depthwise-separable blocks with a
residual connection, for 3x32x32 images and ten classes. modak imports this file only in a child process."""

import torch
from torch import nn


class SeparableBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.pointwise = nn.Conv2d(channels, channels, 1)
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.norm(self.pointwise(self.depthwise(x))))


class TinySeparableNet(nn.Module):
    def __init__(self, width: int, blocks: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, stride=2, padding=1)
        self.blocks = nn.Sequential(*(SeparableBlock(width) for _ in range(blocks)))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(torch.relu(self.stem(x))).mean(dim=(2, 3)))


def build_model(width: int = 32, blocks: int = 4, classes: int = 10) -> nn.Module:
    return TinySeparableNet(width, blocks, classes)
