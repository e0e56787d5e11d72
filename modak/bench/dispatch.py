"""Where a round's launches run: here, one after another (:class:`LocalDispatcher`), or as a Slurm job array on
the target's partition (:class:`SlurmDispatcher`). A dispatcher returns one result per task, in order; a launch
that failed, timed out or never ran is a result with ``status: error`` and the reason, never a partial row."""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from modak.errors import InputError


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
    """Run one launch here and parse its report (the last line of its standard output). The launch runs in a
    process group of its own, ended when it returns, times out or is interrupted: nothing it started (a compiler's
    worker processes) keeps running beside the next launch."""
    process = subprocess.Popen(task.command, env={**os.environ, **task.env}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=task.timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"timed out after {task.timeout_s:.0f} s"}
    finally:
        _end_group(process)
    return parse_report(stdout, stderr, process.returncode)


def _end_group(process: subprocess.Popen) -> None:
    """Kill what is left of ``process``'s group (``process`` leads it) and reap ``process``."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.communicate()


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


def task_spec(task: LaunchTask) -> dict:
    """``task`` as the JSON an array task reads (:mod:`modak.bench.task`)."""
    return {"name": task.name, "env": task.env, "command": list(task.command), "timeout_s": task.timeout_s,
            "folder": str(task.folder)}


def task_from_spec(spec: dict) -> LaunchTask:
    return LaunchTask(spec["name"], dict(spec["env"]), tuple(spec["command"]), float(spec["timeout_s"]),
                      Path(spec["folder"]))


class SlurmDispatcher:
    """Launches run as one Slurm job array per round, one array task per launch, each with a node to itself
    (``--exclusive``), on ``partition`` (Slurm's default if None).

    An array task runs ``sys.executable -m modak.bench.task SPEC`` (:mod:`modak.bench.task`), which writes its
    result atomically beside its spec, so the compute nodes must see the same Python environment and files, and
    the tasks' folders must be on a file system they share (a round's files go beside them). A task without a
    result, or whose result is an error, runs again in a new array up to ``requeue`` times; then its result is an
    error naming its Slurm state. Slurm's time limit (``--time``) is ``time_limit_s``, or the tasks' longest
    timeout plus a minute, in whole minutes: the task's own timeout ends the launch first, Slurm's ends a task
    that hangs past it. A round that has not ended after every task's time limit, one after another, plus a
    margin, is cancelled (``scancel``), as it is on Ctrl-C, so nothing stays queued."""

    MARGIN_S = 120.0  # scheduling on top of the tasks' time limits

    def __init__(self, partition: str | None = None, time_limit_s: float | None = None, extra: Sequence[str] = (),
                 poll_s: float = 1.0, requeue: int = 1) -> None:
        self.partition, self.time_limit_s, self.extra = partition, time_limit_s, list(extra)
        self.poll_s, self.requeue = poll_s, requeue

    def run(self, tasks: Sequence[LaunchTask]) -> list[dict]:
        results: list[dict] = [{} for _ in tasks]
        pending = list(range(len(tasks)))
        for _ in range(self.requeue + 1):
            if not pending:
                break
            for index, result in zip(pending, self._array([tasks[i] for i in pending])):
                results[index] = result
            pending = [i for i in pending if results[i].get("status") == "error"]
        for index in pending:
            failure = results[index]
            times = {1: "once", 2: "twice"}.get(self.requeue + 1, f"{self.requeue + 1} times")
            results[index] = {"status": "error",
                              "error": f"slurm task {failure['slurm_task']} failed {times}: {failure['error']}"}
        return results

    def _array(self, tasks: Sequence[LaunchTask]) -> list[dict]:
        """Run ``tasks`` as one job array; their results, a failed task's naming its Slurm task (``slurm_task``)."""
        folder = Path(tempfile.mkdtemp(prefix="slurm-round-", dir=tasks[0].folder.parent))
        for index, task in enumerate(tasks):
            (folder / f"{index}.json").write_text(json.dumps(task_spec(task)))
        limit_s = self.time_limit_s or max(t.timeout_s for t in tasks) + 60
        script = folder / "array.sh"
        script.write_text(self._script(folder, len(tasks), math.ceil(limit_s / 60)))
        job = self._submit(script)
        finished = self._wait(job, len(tasks) * limit_s + self.MARGIN_S)
        states = _task_states(job)
        results = []
        for index in range(len(tasks)):
            result = _read_result(folder / f"{index}.result.json")
            if result is None:
                reason = states.get(str(index), "no state") + ": " + _tail(folder / f"{index}.out")
                if not finished:
                    reason = f"the array did not end within {len(tasks) * limit_s + self.MARGIN_S:.0f} s; {reason}"
                result = {"status": "error", "error": reason}
            if result.get("status") == "error":
                result["slurm_task"] = f"{job}_{index}"
            results.append(result)
        return results

    def _script(self, folder: Path, count: int, minutes: int) -> str:
        # --exclusive: a measurement needs its node to itself, so two launches never share one.
        directives = [f"--array=0-{count - 1}", "--exclusive", f"--time={minutes}", "--job-name=modak-bench",
                      f"--output={folder}/%a.out"] + ([f"--partition={self.partition}"] if self.partition else [])
        spec = f"{shlex.quote(str(folder))}/$SLURM_ARRAY_TASK_ID.json"
        return "\n".join(["#!/bin/bash", *(f"#SBATCH {d}" for d in directives),
                          f"exec {shlex.quote(sys.executable)} -m modak.bench.task {spec}", ""])

    def _submit(self, script: Path) -> str:
        """Submit ``script``; the job id."""
        argv = ["sbatch", "--parsable", *self.extra, str(script)]
        try:
            process = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        except FileNotFoundError:
            raise InputError("sbatch not found on PATH: --dispatch slurm needs a Slurm client") from None
        job = process.stdout.strip().split(";")[0]
        if process.returncode != 0 or not job.isdigit():
            reason = " ".join((process.stderr or process.stdout).split())[:400] or f"exit status {process.returncode}"
            raise InputError(f"{' '.join(argv)}: {reason}")
        return job

    def _wait(self, job: str, timeout_s: float) -> bool:
        """Wait until the array ``job`` has left the queue (True) or ``timeout_s`` passed (False, cancelled)."""
        deadline = time.monotonic() + timeout_s
        try:
            while _queued(job):
                if time.monotonic() > deadline:
                    _cancel(job)
                    return False
                time.sleep(self.poll_s)
        except BaseException:
            _cancel(job)
            raise
        return True


def _queued(job: str) -> bool:
    """Whether any task of ``job`` is pending or running (an unreachable controller counts as queued)."""
    process = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True)
    if process.returncode != 0:
        return "Invalid job id" not in process.stderr  # purged: it ended long ago
    return bool(process.stdout.strip())


def _cancel(job: str, wait_s: float = 60.0) -> None:
    """Cancel ``job`` and wait (up to ``wait_s``) until its tasks have left the queue."""
    subprocess.run(["scancel", job], capture_output=True)
    deadline = time.monotonic() + wait_s
    while _queued(job) and time.monotonic() < deadline:
        time.sleep(0.5)


def _task_states(job: str) -> dict[str, str]:
    """Each array task's final state and reason, by task index, from ``scontrol`` (it needs no accounting and
    keeps ended jobs for ``MinJobAge``)."""
    process = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    states = {}
    for line in process.stdout.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        reason = fields.get("Reason", "None")
        states[fields.get("ArrayTaskId", "")] = (fields.get("JobState", "UNKNOWN") + f" exit {fields.get('ExitCode')}"
                                                 + (f" ({reason})" if reason != "None" else ""))
    return states


def _read_result(path: Path) -> dict | None:
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return result if isinstance(result, dict) else None


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no output file"
    return (lines or ["no output"])[-1][:500]
