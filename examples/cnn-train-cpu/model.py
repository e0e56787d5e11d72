"""The data scientist's network, in a module of its own: train.py trains it, and the job's `model.pytorch`
names this file and its factory, so that modak plans for this very network (in a child process, never inside
the planner)."""

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def build_model(classes: int = 10) -> nn.Module:
    return Net(classes)
