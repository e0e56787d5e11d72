"""The data-parallel scaling model (``modak scale``) against published scaling efficiencies.

    python -m benchmarks.published.scale_published [--data perfmodels/published/data_parallel_scaling.csv] \\
        [--tolerance 10]

For every published point (``perfmodels/published/``, each row with its source and where in it) the model
predicts the efficiency from the row's setup alone: per-GPU compute time (from the source's single-GPU
throughput, or derived as the row says), the architecture's parameter count (fp32 gradients), GPUs per node,
the intra-node link, the network's kind and bandwidth, the gradient bucket (Horovod's fusion buffer, DDP's
bucket) and the all-reduce algorithms of the time; latencies and the share of the line rate a network's
transport reaches (TCP sockets 0.54, from NCCL users' measurements elsewhere) are the defaults of
``recipes/hardware/interconnects.yaml``. Nothing is fitted to the published efficiencies in this first table.

A second table shows what ``modak scale --measured`` does with one measurement: per setup (same source,
network and worker count) the network bandwidth is fitted to the most communication-bound row (VGG-16) and the
other rows of that setup are predicted with it.

The script reports; it does not fail when points miss the tolerance (exit 0 unless the data cannot be read).
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path

from modak.allreduce import MIB, Link, ScalingModel, default_overlap, network_link
from modak.hardware.ceilings import interconnects
from modak.paths import data_dir
from modak.scaling import fit

DATA = data_dir("perfmodels") / "published" / "data_parallel_scaling.csv"
FIT_ON = "vgg16"  # the row of a setup the bandwidth is fitted to: the most communication-bound


@dataclass(frozen=True)
class Published:
    row: dict[str, str]
    model: ScalingModel

    @property
    def name(self) -> str:
        return self.row["point"]

    @property
    def workers(self) -> int:
        return int(self.row["workers"])

    @property
    def baseline(self) -> int:
        return int(self.row["baseline_workers"])

    @property
    def published(self) -> float:
        return float(self.row["published_efficiency"])

    def predicted(self, model: ScalingModel | None = None) -> float:
        model = model or self.model
        return model.predict(self.baseline).step_s / model.predict(self.workers).step_s

    @property
    def setup(self) -> tuple[str, ...]:
        r = self.row
        return r["source"], r["interconnect"], r["network_gbps"], r["workers"]


def load(path: Path) -> list[Published]:
    table = interconnects()
    points = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            kind = row["intra_link"]
            intra_spec = table["intra_node"][kind]
            bandwidth = float(row["intra_gbs"] or intra_spec.get("bandwidth_gbs", 0))
            intra = Link(kind, bandwidth, float(intra_spec["latency_us"]), "the row's intra-node link")
            network = network_link(row["interconnect"], float(row["network_gbps"]), given="the row's")
            size = float(row["parameters"]) * 4  # fp32 gradients
            bucket = float(row["bucket_mb"]) * MIB
            compute = float(row["compute_seconds"])
            backward = float(row["backward_seconds"]) / compute if row["backward_seconds"] else 2 / 3
            model = ScalingModel(
                compute_s=compute, backward_share=backward, gradient_bytes=size,
                overlap=default_overlap(size, bucket), workers_per_node=int(row["gpus_per_node"]),
                max_nodes=int(row["nodes"]), intra=intra, network=network, bucket_bytes=bucket,
                base_latency_us=float(table["base_latency_us"]), algorithms=tuple(row["algorithms"].split(";")))
            points.append(Published(row, model))
    return points


def report(points: list[Published], tolerance: float) -> None:
    print(f"{'point':36} {'N':>4} {'vs':>3} {'published':>9} {'predicted':>9} {'diff pp':>8}  within")
    within = 0
    for p in points:
        predicted = p.predicted()
        diff = (predicted - p.published) * 100
        ok = abs(diff) <= tolerance
        within += ok
        print(f"{p.name:36} {p.workers:4d} {p.baseline:3d} {p.published:9.3f} {predicted:9.3f} {diff:+8.1f}  "
              f"{'yes' if ok else 'NO'}")
    print(f"{within}/{len(points)} points within {tolerance:g} percentage points (model defaults, nothing fitted)")


def calibrated(points: list[Published], tolerance: float) -> None:
    print(f"\nnetwork bandwidth fitted to the {FIT_ON} row of each setup (as `modak scale --measured 1=T1 N=TN` "
          "would), the setup's other rows predicted with it:")
    print(f"{'point':36} {'N':>4} {'fitted Gbit/s':>13} {'published':>9} {'predicted':>9} {'diff pp':>8}  within")
    within = total = 0
    for setup in dict.fromkeys(p.setup for p in points):
        group = [p for p in points if p.setup == setup]
        anchor = next((p for p in group if p.row["model"] == FIT_ON and p.baseline == 1), None)
        if anchor is None or len(group) < 2:
            continue
        step_n = anchor.model.compute_s / anchor.published
        fitted = fit(anchor.model, {1: anchor.model.compute_s, anchor.workers: step_n}).model
        assert fitted.network is not None
        gbps = fitted.network.bandwidth_gbs * 8
        for p in group:
            if p is anchor:
                continue
            model = ScalingModel(**{**p.model.__dict__, "network": fitted.network})
            predicted = p.predicted(model)
            diff = (predicted - p.published) * 100
            ok = abs(diff) <= tolerance
            within += ok
            total += 1
            print(f"{p.name:36} {p.workers:4d} {gbps:8.3g} of {p.row['network_gbps']:>2} {p.published:9.3f} "
                  f"{predicted:9.3f} {diff:+8.1f}  {'yes' if ok else 'NO'}")
    print(f"{within}/{total} held-out points within {tolerance:g} percentage points "
          "with one fitted bandwidth per setup")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA, help="published points (CSV)")
    parser.add_argument("--tolerance", type=float, default=10.0, help="percentage points (default 10)")
    args = parser.parse_args()
    points = load(args.data)
    report(points, args.tolerance)
    calibrated(points, args.tolerance)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
