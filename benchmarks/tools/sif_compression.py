"""What a target's ``container.sif_compression`` costs and saves: the same job built into a SIF with each setting
(``modak build --engine apptainer --no-smoke``, every build cold: a SIF build has no layer cache), in interleaved
rounds of random order, side by side in one run; each SIF's size, and an ``apptainer exec`` of it (mounting its
squashfs and starting ``true``) as what starting it costs.

Prints seconds and bytes of each setting and their ratios to ``gzip`` (Apptainer's default). Needs Apptainer 1.4
or later on PATH (``.ci/provision.sh apptainer_install``) and the local base image. The job's target is copied
with only ``container.sif_compression`` changed.

    python -m benchmarks.tools.sif_compression [--job examples/mnist-cnn-cpu/job.yaml] [--rounds 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from modak.render.ir import MKSQUASHFS_ARGS

ROOT = Path(__file__).resolve().parents[2]


def job_with(job: Path, compression: str, folder: Path) -> Path:
    """A copy of ``job``'s folder in ``folder`` whose target's container.sif_compression is ``compression``."""
    shutil.copytree(job.parent, folder, ignore=shutil.ignore_patterns("out", "__pycache__"))
    copy = folder / job.name
    spec = yaml.safe_load(copy.read_text())
    target = (folder / spec["target"]).resolve()
    data = yaml.safe_load(target.read_text())
    data["container"] = {**data.get("container", {}), "sif_compression": compression}
    for key in ("wheelhouse", "ca_bundle"):  # paths relative to the original target stay valid
        value = data.get("python", {}).get(key)
        if value and not Path(value).is_absolute():
            data["python"][key] = str((job.parent / spec["target"]).resolve().parent / value)
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=ROOT)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited with {result.returncode}: {result.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=Path, default=ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    order = sorted(MKSQUASHFS_ARGS)
    rows: dict[str, dict[str, list[float]]] = {c: {"build_s": [], "bytes": [], "exec_s": []} for c in order}
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="modak-sif-") as work:
        for round_ in range(args.rounds):
            rng.shuffle(order)
            for compression in order:
                folder = Path(work) / f"{compression}-{round_}"
                job = job_with(args.job.resolve(), compression, folder / "spec")
                out = folder / "out"
                build_s = timed([sys.executable, "-m", "modak", "build", str(job), "-o", str(out), "--engine",
                                 "apptainer", "--no-smoke", "--json"])
                (sif,) = out.glob("*.sif")
                row = rows[compression]
                row["build_s"].append(build_s)
                row["bytes"].append(sif.stat().st_size)
                row["exec_s"].append(timed(["apptainer", "exec", str(sif), "true"]))
                shutil.rmtree(folder)
    summary = {c: {k: statistics.median(v) for k, v in row.items()} for c, row in rows.items()}
    base = summary["gzip"]
    if args.json:
        print(json.dumps({"job": str(args.job), "rounds": args.rounds, "median": summary}, indent=2))
        return 0
    print(f"{args.job} as a SIF, {args.rounds} interleaved round(s), medians; ratios to gzip")
    print(f"{'setting':10} {'build s':>9} {'ratio':>6} {'MB':>8} {'ratio':>6} {'exec s':>7}")
    for compression, row in sorted(summary.items()):
        print(f"{compression:10} {row['build_s']:9.1f} {row['build_s'] / base['build_s']:6.2f} "
              f"{row['bytes'] / 1e6:8.1f} {row['bytes'] / base['bytes']:6.2f} {row['exec_s']:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
