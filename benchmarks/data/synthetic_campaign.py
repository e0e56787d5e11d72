"""Measure synthetic layers (``modak.bench.synthetic``: the operator vocabulary beyond the zoo) on this machine and
add their kernel rows to the shipped ones (``perfmodels/kernels-<target>.csv``, ``reconcile-<target>.csv``).

The probe's own sampling (``modak.bench.kprobe.probe_kernels`` with no zoo model: no zoo layer, no whole model),
each layer planned on ``--target`` (the shipped target of this machine, so its rows carry that machine's name and
ceilings) and measured through the launcher as ``modak bench --kernels`` measures a candidate. Rows of a synthetic
layer are no evaluated model's: ``modak model eval`` trains every fold of their machine on them. Run it on a quiet
machine; the layers are drawn from ``--seed``, and rows already shipped for a layer are replaced.

    python -m benchmarks.data.synthetic_campaign --target perfmodels/targets/ci-emeraldrapids-2c.yaml \
        --layers 400 --budget 25
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path

from modak import api
from modak.bench.kprobe import PROBE_RUNTIMES, probe_kernels
from modak.measurements.kernels import (KERNEL_CSV, RECONCILE_CSV, read_kernel_csv, read_reconcile_csv,
                                        write_kernel_csv, write_reconcile_csv)
from modak.measurements.store import PerfStore
from modak.spec.loader import load_spec
from modak.spec.models import Target

PERFMODELS = Path(__file__).resolve().parents[2] / "perfmodels"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True, help="the shipped target of this machine")
    parser.add_argument("--layers", type=int, default=400, help="synthetic layers drawn (the sampling's pool)")
    parser.add_argument("--budget", type=float, default=25.0, help="minutes of measuring, at most")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runtimes", nargs="+", default=list(PROBE_RUNTIMES))
    parser.add_argument("--out", type=Path, default=PERFMODELS, help="folder of the kernel CSV files")
    args = parser.parse_args()
    machine = load_spec(args.target, Target)[0].name
    with tempfile.TemporaryDirectory(prefix="modak-synthetic-") as scratch:
        with PerfStore(Path(scratch) / "store.sqlite") as store:
            done = probe_kernels(lambda job: api.plan_job(job, args.target, "roofline"), store, args.budget,
                                 models=(), runtimes=args.runtimes, seed=args.seed, synthetic=args.layers)
            rows, recs = store.kernel_rows(machine=machine), store.reconciliations(machine=machine)
    kinds = collections.Counter((r.runtime, r.precision, r.kernel.kind) for r in rows)
    print(f"{len(done.measured)} of {done.drawn_from} synthetic layers measured: {len(rows)} kernel rows of "
          f"{len(kinds)} (runtime, precision, kind), {len(recs)} reconciliations")
    names = {r.model for r in rows} | {r.model for r in recs}
    kernel_csv, reconcile_csv = (args.out / KERNEL_CSV.format(machine=machine),
                                 args.out / RECONCILE_CSV.format(machine=machine))
    shipped = [r for r in read_kernel_csv(kernel_csv) if r.model not in names] if kernel_csv.exists() else []
    shipped_recs = [r for r in read_reconcile_csv(reconcile_csv) if r.model not in names] \
        if reconcile_csv.exists() else []
    print(f"{kernel_csv}: {write_kernel_csv(kernel_csv, [*shipped, *rows])} rows; "
          f"{reconcile_csv}: {write_reconcile_csv(reconcile_csv, [*shipped_recs, *recs])} reconciliations")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
