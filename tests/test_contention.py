"""A real CPU hog started during `modak bench` is detected in every launch, the rows are stored as contended and
`modak model fit` does not learn from them; the watch itself reports a quiet stretch as quiet; a round trip between
CPUs that are one core is slower than between two, and marks a launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modak.bench.harness import CANARIES, slowed_canaries
from modak.measurements.store import PerfStore
from modak.runtime.corelink import round_trip_seconds, wait_until_near
from modak.runtime.measure import CpuWatch, contention_reasons

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"
HOG = "import time\nend = time.time() + 600\nwhile time.time() < end: pass"


@pytest.mark.slow
def test_watch_sees_a_busy_loop_in_another_process():
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        time.sleep(0.3)
        with CpuWatch() as watch:
            time.sleep(1.0)
        busy = watch.report()
    finally:
        hog.kill()
        hog.wait()
    assert busy["other_cores"] > 0.7 and contention_reasons(busy), busy
    with CpuWatch() as watch:
        time.sleep(1.0)
    quiet = watch.report()
    assert quiet["other_cores"] < 0.2 and not contention_reasons(quiet), quiet


def test_a_round_trip_between_cpus_that_are_one_core_marks_a_launch():
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, f"this machine kind has 2 CPUs; this process may use {cpus}"
    apart = round_trip_seconds()
    assert apart is not None and 0 < apart < 1e-4, apart
    together = round_trip_seconds([cpus[0], cpus[0]], trips=20)  # each hand-over waits for the scheduler
    assert together is not None and together > CANARIES["core_rtt"][0] * apart, (together, apart)
    assert os.sched_getaffinity(0) == set(cpus)  # the caller's CPUs are given back
    best = {"core_rtt": apart, "canary": None}
    assert slowed_canaries({"core_rtt_s": together}, best) == [
        f"a round trip between its CPUs took {together / apart:.2f}x its best on this host (they sat on distant "
        "cores)"]
    assert not slowed_canaries({"core_rtt_s": 1.5 * apart, "canary_s": 1.0}, best)
    assert round_trip_seconds([cpus[0]]) is None
    assert round_trip_seconds([cpus[0], max(cpus) + 4096]) is None  # a CPU this process may not use
    assert wait_until_near(1.0) < 1.0  # near enough at once
    assert 1.0 <= wait_until_near(1e-12, timeout_s=1.0) < 5.0  # never that near: waits until its timeout


@pytest.mark.slow
def test_a_cpu_hog_during_bench_is_detected_every_time_and_not_learned_from(tmp_path):
    store = tmp_path / "perf.sqlite"
    plan = json.loads(subprocess.run([sys.executable, "-m", "modak", "plan", str(CNN), "--json"], capture_output=True,
                                     text=True, check=True).stdout)
    chosen = plan["choice"]
    bench = subprocess.Popen([sys.executable, "-m", "modak", "bench", str(CNN), "--candidates", chosen, "--launches",
                              "2", "--min-seconds", "0.5", "--budget", "1", "--store", str(store)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hog = subprocess.Popen([sys.executable, "-c", HOG])  # started while bench starts: a real neighbour
    try:
        _, stderr = bench.communicate(timeout=600)
    finally:
        hog.kill()
        hog.wait()
        bench.kill()  # a no-op once it ended; never left running into the next tests
        bench.wait()
    assert bench.returncode == 0, stderr[-3000:]
    assert "CONTENDED" in stderr and "stored as 'contended'" in stderr
    with PerfStore(store) as perf:
        rows = perf.rows()
    assert len(rows) == 1 and rows[0].status == "contended" and rows[0].launches == 2
    launches = json.loads(rows[0].contention)
    assert all(launch["busy"] and launch["retried_after"] for launch in launches), launches  # tried 3 times each
    assert all(launch["other_cores"] > 0.2 for launch in launches)

    fit = subprocess.run([sys.executable, "-m", "modak", "model", "fit", "--store", str(store)], capture_output=True,
                         text=True, env={**os.environ})
    assert fit.returncode == 0, fit.stderr
    assert "(0 from the local store)" in fit.stdout, fit.stdout

    from modak.predict.training import ok_rows, training_data

    rows_used, _ = training_data(store)
    assert not [r for r in ok_rows(rows_used) if r.session == rows[0].session]


def test_a_retried_launch_says_what_all_its_tries_waited(tmp_path):
    """A launch retried because its CPUs sat apart is stored with the waits of every try added up (near_wait_s),
    not only its last try's; a launch not retried keeps its own."""
    import platform

    from modak.api import load
    from modak.bench.harness import BenchSettings, Session
    from modak.plan import make_plan
    from modak.predict.roofline import RooflinePredictor
    from modak.workload.source import load_analysis

    loaded = load(CNN)
    plan = make_plan(loaded, *load_analysis(loaded), RooflinePredictor())
    apart, near = [r.candidate for r in plan.ranked[:2]]
    best = 2e-7

    def report(rtt: float, waited: float) -> dict:
        return {"status": "ok", "step_median_s": 0.002, "step_p10_s": 0.0019, "step_p90_s": 0.0021, "repeats": 50,
                "contention": {"core_rtt_s": rtt, "core_rtt_cpus": [0, 1], "near_wait_s": waited,
                               "other_cores": 0.0, "steal_cores": 0.0}}

    far = (CANARIES["core_rtt"][0] + 1) * best
    launches = {apart.name: [report(far, 4.0), report(far, 3.5), report(best, 2.0)], near.name: [report(best, 1.5)]}

    class Scripted:
        def run(self, tasks: list) -> list[dict]:
            return [launches[t.name].pop(0) for t in tasks]

    with PerfStore(tmp_path / "s.sqlite") as store, \
            Session(plan, store, BenchSettings(retries=2), Scripted(), tmp_path / "work") as session:
        store.record_canary(platform.node(), best, "core_rtt")
        rows = session.run_round([apart, near])
    assert not any(launches.values())  # the far launch was tried three times, the near one once
    (retried,) = json.loads(rows[apart.name].contention)
    assert retried["near_wait_s"] == 9.5 and retried["retried_after"] and not retried["busy"]
    assert rows[apart.name].status == "ok"
    (alone,) = json.loads(rows[near.name].contention)
    assert alone["near_wait_s"] == 1.5 and alone["retried_after"] is None
