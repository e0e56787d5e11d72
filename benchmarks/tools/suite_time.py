"""How long the suite takes on this machine, and how much CPU work it is (#65 item 5): each test's wall time and the
machine's busy CPU time over it (``/proc/stat``: the test's own processes and the services it drives, Podman,
Apptainer, Slurm), and the floor that CPU work sets: what the suite would take with every CPU busy throughout.

Run it alone: another busy process counts as the suite's work. It runs pytest with itself as a plugin, writes one
JSON line per test to the record, prints the summary and exits with pytest's code.

    python -m benchmarks.tools.suite_time [--record FILE] [-- PYTEST ARGUMENTS (default: -q tests)]
    python -m benchmarks.tools.suite_time --summary FILE [--top 15]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RECORD_ENV = "MODAK_SUITE_TIME_RECORD"
ROOT = Path(__file__).resolve().parents[2]


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot, all CPUs together (``/proc/stat``)."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def machine() -> str:
    """The CPU kind (archspec's name), /proc/cpuinfo's family, model and name, and the CPUs this process may use."""
    from modak.hardware.probe import host_microarchitecture

    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return (f"{host_microarchitecture().name} ({fields.get('model name', '?')}, family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')}), {len(os.sched_getaffinity(0))} CPUs")


class Recorder:
    """The pytest plugin: one record line per test, written as the test ends (setup and teardown included)."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("w")
        self.outcomes: dict[str, str] = {}

    def write(self, row: dict[str, Any]) -> None:
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self) -> None:
        self.start = (time.monotonic(), busy_cpu_seconds())
        self.write({"machine": machine(), "cpus": len(os.sched_getaffinity(0))})

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        wall, cpu = time.monotonic(), busy_cpu_seconds()
        yield
        self.write({"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 3),
                    "cpu_s": round(busy_cpu_seconds() - cpu, 2), "outcome": self.outcomes.pop(item.nodeid, "passed")})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
        elif report.skipped:
            self.outcomes.setdefault(report.nodeid, "skipped")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, exitstatus: int) -> None:
        wall, cpu = self.start
        self.write({"session_wall_s": round(time.monotonic() - wall, 1),
                    "session_cpu_s": round(busy_cpu_seconds() - cpu, 1), "exit": int(exitstatus)})
        self.file.close()


def pytest_configure(config: pytest.Config) -> None:
    """Registers the recorder when pytest loads this module (``-p benchmarks.tools.suite_time``)."""
    record = os.environ.get(RECORD_ENV)
    if record:
        config.pluginmanager.register(Recorder(Path(record)), "suite-time-recorder")


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:04.1f} s"


def summary(record: Path, top: int) -> str:
    """The record's figures: tests by outcome, wall and CPU time, the floor on the machine's CPUs, the slowest files
    and tests."""
    try:
        lines = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as error:
        raise ValueError(f"{record}: not a record of this tool: {error}") from None
    head = next((line for line in lines if "machine" in line), None)
    tests = [line for line in lines if "test" in line]
    end = next((line for line in lines if "session_wall_s" in line), None)
    if head is None or end is None:
        raise ValueError(f"{record}: not a whole record (was the run stopped?): {len(tests)} tests in it")
    outcomes: dict[str, int] = defaultdict(int)
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for test in tests:
        outcomes[test["outcome"]] += 1
        totals = by_file[test["test"].split("::")[0]]
        totals[0] += test["wall_s"]
        totals[1] += test["cpu_s"]
    wall, cpu, cpus = end["session_wall_s"], end["session_cpu_s"], head["cpus"]
    counted = ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items()))
    out = [f"machine: {head['machine']}",
           f"{len(tests)} tests ({counted}), pytest exit {end['exit']}",
           f"wall: {minutes(wall)}; CPU: {cpu:,.1f} core-seconds, {cpu / wall:.2f} of {cpus} CPUs busy on average",
           f"floor: {minutes(cpu / cpus)} (this CPU work with all {cpus} CPUs busy throughout)",
           "slowest files (wall s, CPU core-s, share of the wall):"]
    for name, (file_wall, file_cpu) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        out.append(f"  {file_wall:7.1f} {file_cpu:7.1f} {file_wall / wall:6.1%}  {name}")
    out.append("slowest tests (wall s, CPU core-s):")
    for test in sorted(tests, key=lambda t: -t["wall_s"])[:top]:
        out.append(f"  {test['wall_s']:7.1f} {test['cpu_s']:7.1f}  {test['test']}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=Path, default=Path("suite-time.jsonl"))
    parser.add_argument("--summary", type=Path, help="summarise this record instead of running the suite")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: -q tests)")
    args = parser.parse_args(argv)
    record = args.summary or args.record.resolve()
    code = 0
    if not args.summary:
        command = [sys.executable, "-m", "pytest", "-p", "benchmarks.tools.suite_time",
                   *(args.pytest_args or ["-q", "tests"])]
        code = subprocess.run(command, cwd=ROOT, env={**os.environ, RECORD_ENV: str(record)}).returncode
    try:
        print(summary(record, args.top))
    except ValueError as error:
        print(f"suite_time: {error}", file=sys.stderr)
        return code or 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
