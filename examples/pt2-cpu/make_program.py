"""Makes model.pt2, the `torch.export` program this example's job deploys: a small keyword-spotting-style 1-D
convolutional network (not one of modak's zoo architectures) over 40 mel bands x 64 frames, with seeded
weights, exported with a dynamic batch. A program needs none of the code that made it: modak and the image
load it with `torch.export.load`.

    python3 make_program.py [OUTPUT]      # default: model.pt2 next to this script
"""

import sys
from pathlib import Path

import torch
from torch import nn

BANDS, FRAMES, CLASSES = 40, 64, 12


class KeywordNet(nn.Module):
    def __init__(self, width: int = 24) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(BANDS, width, 5, padding=2), nn.BatchNorm1d(width), nn.ReLU(),
            nn.Conv1d(width, width, 5, padding=4, dilation=2), nn.BatchNorm1d(width), nn.ReLU())
        self.head = nn.Linear(2 * width, CLASSES)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        features = self.features(mel)
        return self.head(torch.cat([features.mean(dim=2), features.amax(dim=2)], dim=1))


def make(path: Path) -> None:
    """Seeded weights and batch-norm statistics, in eval mode, exported with a dynamic batch, saved to ``path``."""
    torch.manual_seed(0)
    model = KeywordNet()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)
    model.eval()
    example = torch.randn(2, BANDS, FRAMES)
    program = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, path)


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "model.pt2")
