"""The long fuzz profile: many hostile jobs and targets through `modak plan/render/analyze` (in-process).

Cases come from the strategies of ``tests/support/fuzzing.py`` (the bundled examples' jobs and targets, mutated) and
are checked the same way as ``tests/test_fuzz.py`` does: exit code 0 or 2 only, one error line, no partial
output folder, rendered scripts and build files with every hostile value quoted. Prints the cases run, the
exit-code histogram, the crashes (the first few inputs in full), the maximum RSS and the wall time; exits 1
when any case crashed. It runs in a scratch store and cache, with the tests' probe as this host's (``cpu: local``).

    python -m benchmarks.tools.fuzz [--cases 10000] [--seed N] [--show 3]
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--show", type=int, default=3, help="crashing inputs printed in full (default 3)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="modak-fuzz-"))
    os.environ["MODAK_STORE"] = str(scratch / "perf.sqlite")  # never the user's store
    # Nor the user's cache: `cpu: local` is the tests' probe there, not a probe of this machine in every case (the
    # probe is not cached while the machine is busy, and the fuzzer keeps it busy). Zoo models export once into it.
    os.environ["MODAK_CACHE"] = str(scratch / "cache")
    os.environ.pop("MODAK_DEBUG", None)
    os.environ.pop("MODAK_TEMPLATES", None)

    from hypothesis import HealthCheck, given, seed, settings

    from modak.hardware.local import store_probe
    from tests.support.fuzzing import cases, example_seeds, run_case
    from tests.support.host import TEST_HOST_PROBE

    store_probe(TEST_HOST_PROBE)

    jobs, targets = example_seeds()
    codes: collections.Counter[int] = collections.Counter()
    crashes: list[tuple[object, list[str]]] = []
    start = time.perf_counter()

    @seed(args.seed)
    @settings(max_examples=args.cases, deadline=None, database=None, phases=["generate"],
              suppress_health_check=list(HealthCheck))
    @given(cases(jobs, targets))
    def fuzz(case: object) -> None:
        outcome = run_case(case)
        codes[outcome.exit_code] += 1
        if outcome.problems:
            crashes.append((case, outcome.problems))
        done = sum(codes.values())
        if done % 500 == 0:
            print(f"... {done} cases, {len(crashes)} crashes, {time.perf_counter() - start:.0f} s", file=sys.stderr,
                  flush=True)

    fuzz()
    wall = time.perf_counter() - start
    print(f"cases run: {sum(codes.values())}")
    print("exit codes: " + ", ".join(f"{code}: {count}" for code, count in sorted(codes.items())))
    print(f"crashes: {len(crashes)}")
    for problem, count in collections.Counter(p for _, problems in crashes for p in problems[:1]).most_common(10):
        print(f"  {count} x {problem[:300]}")
    for case, problems in crashes[:args.show]:
        print("--- crashing input: " + "; ".join(problems)[:1000])
        print(case.describe())
    print(f"max RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print(f"wall time: {wall:.1f} s ({sum(codes.values()) / wall:.1f} cases/s)")
    return 1 if crashes else 0


if __name__ == "__main__":
    raise SystemExit(main())
