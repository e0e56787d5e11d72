"""The user's own PyTorch model: the zero-shot pick with the full runtime set against the measured best, and what the
ONNX-only pick of the same model leaves on the table.

Three architectures outside modak's zoo, defined here (a depthwise-separable residual CNN, a gated residual MLP,
a convolution-plus-attention sequence model), each given to modak as a ``model.pytorch`` job (this file's
network module, written to a temporary folder) and, a second time, as the ONNX file modak exported from it (the
``onnx:`` job a user had before: PyTorch eager, ``torch.compile`` and XLA are pruned for it). Per architecture the
plan of the module job's top candidates and the ONNX job's choice are measured with the harness (``modak bench``'s),
one launch each per round in a new random order every round, and the table prints: the zero-shot pick (the module
plan's choice), the measured best among everything measured, the pick's step over the best's, the ONNX-only pick
and its step over the best's (the ratio a user of ONNX files left on the table). Run it on a quiet machine:

    flock -x /tmp/modak-quiet.lock python -m benchmarks.models.own_model [--target TARGET] [--top 3]
        [--rounds 3] [--models separable-cnn residual-mlp conv-attention]
    python -m benchmarks.models.own_model --quick      # tiny sizes, the pick and the ONNX pick, one launch: a
                                                       # check of the pipeline, not a measurement
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.tools.zoo_jobs import measure_plans
from modak import api
from modak.bench.harness import BenchSettings
from modak.measurements.store import PerfStore
from modak.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TARGET = ROOT / "examples" / "own-model-cpu" / "target.yaml"  # cpu: local, this machine
NETWORKS = '''\
import torch
import torch.nn.functional as F
from torch import nn


class SeparableBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.pointwise = nn.Conv2d(channels, channels, 1)
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x):
        return x + torch.relu(self.norm(self.pointwise(self.depthwise(x))))


class SeparableCNN(nn.Module):
    def __init__(self, width, blocks):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, stride=2, padding=1)
        self.blocks = nn.Sequential(*(SeparableBlock(width) for _ in range(blocks)))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.blocks(torch.relu(self.stem(x))).mean(dim=(2, 3)))


class GatedMLP(nn.Module):
    def __init__(self, features, hidden, blocks):
        super().__init__()
        self.embed = nn.Linear(features, hidden)
        self.gates = nn.ModuleList(nn.Linear(hidden, 2 * hidden) for _ in range(blocks))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(blocks))
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):
        x = self.embed(x)
        for gate, norm in zip(self.gates, self.norms):
            value, weight = gate(norm(x)).chunk(2, dim=-1)
            x = x + value * torch.sigmoid(weight)
        return self.head(x)


class ConvAttention(nn.Module):
    def __init__(self, channels, width, heads):
        super().__init__()
        self.heads = heads
        self.conv = nn.Conv1d(channels, width, 5, padding=2)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x):  # (batch, channels, time)
        x = F.gelu(self.conv(x)).transpose(1, 2)  # (batch, time, width)
        batch, time, width = x.shape
        q, k, v = (t.reshape(batch, time, self.heads, width // self.heads).transpose(1, 2)
                   for t in self.qkv(self.norm(x)).chunk(3, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, time, width)
        return self.head((x + self.out(attended)).mean(dim=1))


def separable_cnn(width=32, blocks=4):
    return SeparableCNN(width, blocks)


def residual_mlp(features=256, hidden=512, blocks=4):
    return GatedMLP(features, hidden, blocks)


def conv_attention(channels=32, width=64, heads=4):
    return ConvAttention(channels, width, heads)
'''


@dataclass(frozen=True)
class Architecture:
    """One network of :data:`NETWORKS`: its factory, kwargs, per-sample input shape and batch, full and quick."""

    name: str
    factory: str
    kwargs: dict[str, int]
    input_shape: list[int]
    batch_size: int
    quick_kwargs: dict[str, int]
    quick_shape: list[int]


ARCHITECTURES = (
    Architecture("separable-cnn", "separable_cnn", {"width": 32, "blocks": 4}, [3, 32, 32], 32,
                 {"width": 8, "blocks": 1}, [3, 16, 16]),
    Architecture("residual-mlp", "residual_mlp", {"features": 256, "hidden": 512, "blocks": 4}, [256], 64,
                 {"features": 32, "hidden": 32, "blocks": 1}, [32]),
    Architecture("conv-attention", "conv_attention", {"channels": 32, "width": 64, "heads": 4}, [32, 128], 16,
                 {"channels": 8, "width": 16, "heads": 2}, [8, 16]),
)
QUICK_BATCH = 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=DEFAULT_TARGET, help="target spec (default: this machine)")
    parser.add_argument("--top", type=int, default=3, help="the module plan's top candidates measured (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="launches of each candidate, one per round")
    parser.add_argument("--models", nargs="+", choices=[a.name for a in ARCHITECTURES], help="default: all three")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, the pick and the ONNX pick only, one launch of a fraction of a second")
    args = parser.parse_args()
    top, rounds = (1, 1) if args.quick else (args.top, args.rounds)
    settings = (BenchSettings(launches=1, min_seconds=0.05, budget_s=0.2, retries=0) if args.quick
                else BenchSettings(launches=1, min_seconds=0.5, budget_s=2.0))
    print(f"{'model':<15} {'pick ms':>9} {'best ms':>9} {'pick/best':>9} {'ONNX ms':>9} {'left':>7}   "
          "(ms per step; left: the ONNX-only pick's step over the best's)")
    with tempfile.TemporaryDirectory(prefix="modak-own-model-") as tmp, \
            PerfStore(Path(tmp) / "own-model.sqlite") as store:
        folder = Path(tmp)
        (folder / "nets.py").write_text(NETWORKS)
        for architecture in ARCHITECTURES:
            if args.models and architecture.name not in args.models:
                continue
            module_plan, onnx_plan = plans(folder, architecture, args.target.resolve(), args.quick)
            pairs = {f"top{index + 1}": (module_plan, ranked.candidate)
                     for index, ranked in enumerate(module_plan.ranked[:top])}
            if onnx_plan is not None:
                pairs["onnx-only"] = (onnx_plan, onnx_plan.choice.candidate)
            medians = measure_plans(pairs, rounds, settings, store)
            print(row(architecture.name, pairs, medians), flush=True)
    return 0


def plans(folder: Path, architecture: Architecture, target: Path, quick: bool) -> tuple[Plan, Plan | None]:
    """The plan of the module job and of the ONNX job of its export (None when no exporter could export it)."""
    shape = architecture.quick_shape if quick else architecture.input_shape
    batch = QUICK_BATCH if quick else architecture.batch_size
    common = {"apiVersion": "modak/v1", "kind": "Job", "target": str(target), "task": "inference",
              "precision": ["fp32", "bf16"], "objective": {"metric": "throughput"}}
    module_job = folder / f"{architecture.name}.yaml"
    module_job.write_text(yaml.safe_dump({**common, "name": architecture.name, "model": {
        "pytorch": {"module": "nets.py", "factory": architecture.factory,
                    "kwargs": architecture.quick_kwargs if quick else architecture.kwargs},
        "input_shape": shape, "batch_size": batch}}, sort_keys=False))
    module_plan = api.plan_job(module_job)
    user = module_plan.source.user
    if user is None or user.onnx_path is None:
        return module_plan, None
    graph = folder / architecture.name
    shutil.copytree(user.folder, graph, dirs_exist_ok=True)  # the export and its external data
    onnx_job = folder / f"{architecture.name}-onnx.yaml"
    onnx_job.write_text(yaml.safe_dump({**common, "name": f"{architecture.name}-onnx", "model": {
        "onnx": str(graph / user.onnx_path.name), "input_shape": shape, "batch_size": batch}}, sort_keys=False))
    return module_plan, api.plan_job(onnx_job)


def row(name: str, pairs: dict, medians: dict[str, float | None]) -> str:
    """The table's line of one architecture (steps in ms and the ratios), then the candidates' names indented."""
    measured = {label: seconds for label, seconds in medians.items() if seconds is not None}
    if "top1" not in measured:
        return f"{name:<15} the zero-shot pick failed to run"
    best = min(measured, key=measured.__getitem__)
    onnx = measured.get("onnx-only")
    onnx_text = f"{onnx * 1e3:9.3f} {onnx / measured[best]:6.2f}x" if onnx is not None else f"{'-':>9} {'-':>7}"
    names = [f"  zero-shot pick: {pairs['top1'][1].name}", f"  measured best ({best}): {pairs[best][1].name}"]
    names += [f"  ONNX-only pick: {pairs['onnx-only'][1].name}" if "onnx-only" in pairs
              else "  ONNX-only pick: none (no exporter could export the model)"]
    return "\n".join([f"{name:<15} {measured['top1'] * 1e3:9.3f} {measured[best] * 1e3:9.3f} "
                       f"{measured['top1'] / measured[best]:8.2f}x {onnx_text}", *names])


if __name__ == "__main__":
    raise SystemExit(main())
