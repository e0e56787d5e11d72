"""Spec texts several test files write, and the bundled examples as the tests copy them."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# A 4-core Ice Lake box with no scheduler: the smallest target the spec accepts with a named CPU.
CPU_TARGET = """\
apiVersion: modak/v1
kind: Target
name: cpu-box
cpu:
  microarchitecture: icelake
  cores_per_socket: 4
memory:
  size_gb: 16
"""

# A small residual MLP-mixer-like network (not a zoo architecture), the module file of a user's own model.
MIXER_MODULE = """\
import torch
from torch import nn


class Mixer(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.norm = nn.BatchNorm2d(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        y = torch.relu(self.norm(self.conv(x)))
        return self.head((y + y.mean(dim=1, keepdim=True)).mean(dim=(2, 3)))


def build_model(width=8):
    return Mixer(width)
"""


def copied_example(tmp_path: Path, name: str) -> Path:
    """examples/NAME copied into ``tmp_path`` with :data:`CPU_TARGET` as its target: the copy's job file."""
    folder = tmp_path / name
    shutil.copytree(EXAMPLES / name, folder)
    (folder / "target.yaml").write_text(CPU_TARGET)
    job = yaml.safe_load((folder / "job.yaml").read_text())
    job["target"] = "target.yaml"
    (folder / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return folder / "job.yaml"
