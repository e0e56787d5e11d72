"""Where a round's launches run: here, one after another (:class:`LocalDispatcher`), or as a Slurm job array on
the target's partition (:class:`SlurmDispatcher`). A dispatcher returns one result per task, in order; a launch
that failed, timed out or never ran is a result with ``status: error`` and the reason, never a partial row."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence


@dataclass(frozen=True)
class LaunchTask:
    """One launch: a candidate's measurement command, the variables that locate its deployment, a time limit and a
    folder of its own (on a file system the compute nodes share, for Slurm)."""

    name: str
    env: dict[str, str]
    command: tuple[str, ...]
    timeout_s: float
    folder: Path


class Dispatcher(Protocol):
    def run(self, tasks: Sequence[LaunchTask]) -> list[dict]:
        """Run ``tasks``; their results (the runner's JSON report), in the same order."""
        ...


def run_task(task: LaunchTask) -> dict:
    """Run one launch here and parse its report (the last line of its standard output)."""
    try:
        process = subprocess.run(task.command, env={**os.environ, **task.env}, capture_output=True, text=True,
                                 timeout=task.timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"timed out after {task.timeout_s:.0f} s"}
    return parse_report(process.stdout, process.stderr, process.returncode)


def parse_report(stdout: str, stderr: str, returncode: int | None) -> dict:
    """The runner's JSON report from its output, or an error result naming how it ended."""
    lines = stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
        if isinstance(report, dict) and "status" in report:
            return report
    except (IndexError, json.JSONDecodeError):
        pass
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": "error", "error": f"runner exited with {returncode}: {tail}"[:2000]}


class LocalDispatcher:
    """Launches run on this machine, one at a time (a benchmark needs the machine to itself)."""

    def run(self, tasks: Sequence[LaunchTask]) -> list[dict]:
        return [run_task(task) for task in tasks]
