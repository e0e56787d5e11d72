"""Where a round's launches run: here, one after another (:class:`LocalDispatcher`), or as a job array of a
scheduler that runs them (:class:`ArrayDispatcher`, e.g. Slurm's) on the target's partition. A dispatcher returns
one result per task, in order; a launch that failed, timed out or never ran is a result with ``status: error`` and
the reason, never a partial row."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from modak.errors import InputError
from modak.runtime.corelink import round_trip_seconds, wait_until_near
from modak.schedulers import SCHEDULERS, ArrayScheduler, scheduler


@dataclass(frozen=True)
class LaunchTask:
    """One launch: a candidate's measurement command, the variables that locate its deployment, a time limit, a
    folder of its own (on a file system the compute nodes share, for Slurm) and the round trip between the CPUs
    it waits for before it starts (None: it starts at once; :func:`modak.runtime.corelink.wait_until_near`)."""

    name: str
    env: dict[str, str]
    command: tuple[str, ...]
    timeout_s: float
    folder: Path
    near_rtt_s: float | None = None


class Dispatcher(Protocol):
    def run(self, tasks: Sequence[LaunchTask]) -> list[dict]:
        """Run ``tasks``; their results (the runner's JSON report), in the same order."""
        ...


def run_task(task: LaunchTask) -> dict:
    """Run one launch here and parse its report (the last line of its standard output). The launch runs in a
    process group of its own, ended when it returns, times out or is interrupted: nothing it started (a compiler's
    worker processes) keeps running beside the next launch. Its CPUs' round trip is measured again once it ended
    (:func:`_round_trip_after`)."""
    waited = wait_until_near(task.near_rtt_s) if task.near_rtt_s else 0.0
    process = subprocess.Popen(task.command, env={**os.environ, **task.env}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=task.timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"timed out after {task.timeout_s:.0f} s"}
    finally:
        _end_group(process)
    return _round_trip_after(parse_report(stdout, stderr, process.returncode), waited)


def _round_trip_after(report: dict, waited_s: float) -> dict:
    """``report`` whose contention's ``core_rtt_s`` (the round trip between the launch's first and last CPU,
    ``core_rtt_cpus``, before its runtime started) is the slower of it and one between the same CPUs measured here,
    now that the launch has ended (the vCPUs may have moved apart while it ran), with the seconds the launch waited
    for its CPUs to come near (``near_wait_s``; a retried launch's row adds its earlier tries' waits). A launch on
    one CPU has no round trip, before or after."""
    contention = report.get("contention")
    if isinstance(contention, dict) and contention.get("core_rtt_s") and contention.get("core_rtt_cpus"):
        after = round_trip_seconds(contention["core_rtt_cpus"])
        contention.update(core_rtt_s=max(contention["core_rtt_s"], after or 0.0), near_wait_s=round(waited_s, 1))
    return report


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
            "folder": str(task.folder), "near_rtt_s": task.near_rtt_s}


def task_from_spec(spec: dict) -> LaunchTask:
    return LaunchTask(spec["name"], dict(spec["env"]), tuple(spec["command"]), float(spec["timeout_s"]),
                      Path(spec["folder"]), spec.get("near_rtt_s"))


class ArrayDispatcher:
    """Launches run as one job array of ``scheduler`` per round, one array task per launch, each with a node to
    itself, on ``partition`` (the scheduler's default if None); ``extra``: options of its submit command.

    An array task runs ``sys.executable -m modak.bench.task SPEC`` (:mod:`modak.bench.task`), which writes its
    result atomically beside its spec, so the compute nodes must see the same Python environment and files, and
    the tasks' folders must be on a file system they share (a round's files go beside them). A task without a
    result, or whose result is an error, runs again in a new array up to ``requeue`` times; then its result is an
    error naming its state in the scheduler. The scheduler's time limit is ``time_limit_s``, or the tasks' longest
    timeout plus a minute, in whole minutes: the task's own timeout ends the launch first, the scheduler's ends a
    task that hangs past it. A round that has not ended after every task's time limit, one after another, plus a
    margin, is cancelled, as it is on Ctrl-C, so nothing stays queued."""

    MARGIN_S = 120.0  # scheduling on top of the tasks' time limits

    def __init__(self, scheduler: ArrayScheduler, partition: str | None = None, time_limit_s: float | None = None,
                 extra: Sequence[str] = (), poll_s: float = 1.0, requeue: int = 1) -> None:
        self.scheduler, self.partition, self.time_limit_s, self.extra = scheduler, partition, time_limit_s, list(extra)
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
            results[index] = {"status": "error", "error": f"{self.scheduler.name} task {failure['array_task']} "
                                                          f"failed {times}: {failure['error']}"}
        return results

    def _array(self, tasks: Sequence[LaunchTask]) -> list[dict]:
        """Run ``tasks`` as one job array; their results, a failed task's naming its array task (``array_task``)."""
        folder = Path(tempfile.mkdtemp(prefix=f"{self.scheduler.name}-round-", dir=tasks[0].folder.parent))
        for index, task in enumerate(tasks):
            (folder / f"{index}.json").write_text(json.dumps(task_spec(task)))
        limit_s = self.time_limit_s or max(t.timeout_s for t in tasks) + 60
        script = folder / "array.sh"
        script.write_text(self.scheduler.array_script(len(tasks), math.ceil(limit_s / 60), folder, self.partition,
                                                      (sys.executable, "-m", "modak.bench.task")))
        job = self.scheduler.submit_array(script, self.extra)
        finished = self._wait(job, len(tasks) * limit_s + self.MARGIN_S)
        states = self.scheduler.task_states(job)
        results = []
        for index in range(len(tasks)):
            result = _read_result(folder / f"{index}.result.json")
            if result is None:
                reason = states.get(str(index), "no state") + ": " + _tail(folder / f"{index}.out")
                if not finished:
                    reason = f"the array did not end within {len(tasks) * limit_s + self.MARGIN_S:.0f} s; {reason}"
                result = {"status": "error", "error": reason}
            if result.get("status") == "error":
                result["array_task"] = self.scheduler.task_name(job, index)
            results.append(result)
        return results

    def _wait(self, job: str, timeout_s: float) -> bool:
        """Wait until the array ``job`` has left the queue (True) or ``timeout_s`` passed (False, cancelled)."""
        deadline = time.monotonic() + timeout_s
        try:
            while self.scheduler.queued(job):
                if time.monotonic() > deadline:
                    self.scheduler.cancel(job)
                    return False
                time.sleep(self.poll_s)
        except BaseException:
            self.scheduler.cancel(job)
            raise
        return True


def dispatch_names() -> tuple[str, ...]:
    """What ``modak tune --dispatch`` takes: ``local``, or a scheduler that runs job arrays."""
    return ("local", *(name for name in SCHEDULERS.names() if issubclass(SCHEDULERS.get(name), ArrayScheduler)))


def dispatcher(name: str, partition: str | None = None) -> Dispatcher:
    """The dispatcher called ``name`` (one of :func:`dispatch_names`); ``partition``: a job array's."""
    if name == "local":
        return LocalDispatcher()
    where = scheduler(name)
    if not isinstance(where, ArrayScheduler):
        raise InputError(f"the {name} scheduler runs no job arrays (--dispatch takes {', '.join(dispatch_names())})")
    return ArrayDispatcher(where, partition)


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
