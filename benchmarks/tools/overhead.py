"""Fit each runtime's dispatch overhead (per graph node, per call) from the overhead probe's measurements.

The probe (``benchmarks/tools/overhead.yaml``) measures every runtime configuration on two chains of tiny fully
connected layers, zoo ``chain4`` (8 graph nodes) and ``chain64`` (128), whose compute is negligible, so a step is

    step = call + forward graph nodes x node

and the two chains give both terms, for inference and for training (whose node term covers forward, backward and
update). The recipes' CPU priors (``node_overhead_us``, ``call_overhead_us``, their ``training_`` twins) and the
``overhead`` effects of their parameters are these numbers; none of them comes from the models that
``modak model eval`` holds out.

    python -m benchmarks.data.campaign --config benchmarks/tools/overhead.yaml \\
        --target perfmodels/targets/ci-zen3-2c.yaml --store /tmp/overhead.sqlite \\
        --export perfmodels/overhead/cpu-ci-zen3-2c.csv
    python -m benchmarks.tools.overhead perfmodels/overhead/cpu-ci-zen3-2c.csv
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from modak.candidates.catalog import load_catalog
from modak.measurements.store import Measurement, read_csv
from modak.predict.learned import candidate_from_row
from modak.predict.roofline import overhead_seconds
from modak.predict.training import ok_rows

SHORT, LONG = "chain4", "chain64"


def fit(short: Measurement, long: Measurement) -> tuple[float, float, float, float]:
    """(node µs, call µs, node µs low, node µs high) from the two chains' medians; the node interval comes from
    the rows' confidence intervals (long's low minus short's high, and the reverse)."""
    nodes = long.nodes - short.nodes
    node = (long.step_median_s - short.step_median_s) / nodes
    low = ((long.ci_low_s or long.step_median_s) - (short.ci_high_s or short.step_median_s)) / nodes
    high = ((long.ci_high_s or long.step_median_s) - (short.ci_low_s or short.step_median_s)) / nodes
    call = short.step_median_s - short.nodes * node
    return node * 1e6, call * 1e6, low * 1e6, high * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path, help="the probe's rows (campaign export)")
    args = parser.parse_args()
    catalog = load_catalog()
    chains: dict[tuple[str, str, str, str], dict[str, Measurement]] = {}
    for row in ok_rows(read_csv(args.csv)):
        if row.model in (SHORT, LONG):
            params = json.dumps(json.loads(row.params), sort_keys=True)
            chains.setdefault((row.runtime, row.device, row.task, params), {})[row.model] = row
    print(f"{'runtime':14s} {'task':9s} {'node µs [90% CI]':22s} {'call µs':>8s}  {'catalog node/call':>18s}  params")
    for (runtime, _device, task, params), pair in sorted(chains.items()):
        if len(pair) < 2:
            print(f"{runtime:14s} {task:9s} only {', '.join(pair)} measured ok  {params}")
            continue
        node, call, low, high = fit(pair[SHORT], pair[LONG])
        prior = overhead_seconds(catalog[runtime], candidate_from_row(pair[SHORT]), 1, task == "training"), \
            overhead_seconds(catalog[runtime], candidate_from_row(pair[SHORT]), 0, task == "training")
        print(f"{runtime:14s} {task:9s} {node:6.2f} [{low:5.2f}, {high:5.2f}]   {call:8.1f}  "
              f"{(prior[0] - prior[1]) * 1e6:7.3g} / {prior[1] * 1e6:<6.3g}  {params}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
