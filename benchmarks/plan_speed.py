"""Wall time of `modak plan` (process start included) on ResNet-50, against a bare `python -c pass`.

The zoo export is made once before timing (a cached export is the steady state; the first plan of a zoo
model also exports it with PyTorch, which this script reports separately). Target: <= 2 s.

    python benchmarks/plan_speed.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = """\
apiVersion: modak/v1
kind: Job
name: resnet50-infer
task: inference
model: {zoo: resnet50, input_shape: [3, 224, 224], batch_size: 1}
precision: [fp32, bf16]
"""


def wall(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.yaml"
        job.write_text(JOB)
        env = {**os.environ, "MODAK_CACHE": str(Path(tmp) / "cache")}
        plan = [sys.executable, "-m", "modak", "plan", str(job), "--target",
                str(ROOT / "examples" / "mnist-cnn-cpu" / "target.yaml"), "--json"]
        first = wall(plan, env)
        python = statistics.median(wall([sys.executable, "-c", "pass"], env) for _ in range(args.runs))
        times = [wall(plan, env) for _ in range(args.runs)]
    median = statistics.median(times)
    print(f"{'what':<44} {'seconds':>8} {'ratio to python start':>22}")
    print(f"{'python -c pass':<44} {python:8.3f} {1.0:22.1f}")
    print(f"{'modak plan resnet50 (first: exports ONNX)':<44} {first:8.3f} {first / python:22.1f}")
    print(f"{'modak plan resnet50 (cached export), median':<44} {median:8.3f} {median / python:22.1f}")
    print(f"{'  min / max over ' + str(args.runs) + ' runs':<44} {min(times):8.3f} / {max(times):.3f}")
    print(f"target <= 2 s: {'met' if median <= 2.0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
