"""The interface every scheduler implements, and the registry of them.

A scheduler is one module beside this one (its class, registered with ``@SCHEDULERS.register(NAME)``; NAME is the
target's ``scheduler.kind``) plus one job script template, ``templates/jobscript/NAME.sh.j2``, which extends
``jobscript/base.sh.j2`` and fills its blocks: ``directives``, ``prologue``, and for jobs on several nodes
``rendezvous`` (the first node and a run id), ``launch`` (what starts one task per node) and ``gpu_list`` (the
GPUs it allocated on a node). Templates see the scheduler as ``scheduler``.

A scheduler that runs job arrays (``modak tune --dispatch NAME``) is an :class:`ArrayScheduler`.
"""

from __future__ import annotations

import re
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from modak.errors import InputError, SubmitFailed
from modak.registry import Registry


@dataclass
class Submission:
    scheduler: str  # the scheduler's name (the target's scheduler.kind)
    job_id: str
    script: Path
    cwd: Path
    output: Path | None  # the job's output file (what the job script's directives name)
    command: list[str] = field(default_factory=list)
    state: str | None = None
    exit_code: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "job_id": self.job_id, "script": str(self.script), "cwd": str(self.cwd),
                "output": str(self.output) if self.output else None, "command": self.command,
                "state": self.state, "exit_code": self.exit_code}


class Scheduler(ABC):
    """Where a job script goes: its template, its output file, how it is submitted and how its job ends."""

    template: ClassVar[str]  # the job script template (extends jobscript/base.sh.j2)
    command: ClassVar[str]  # the program that takes the job script
    submit_options: ClassVar[tuple[str, ...]] = ()  # given to ``command`` before the caller's
    job_id: ClassVar[re.Pattern[str]]  # ``command``'s last output line; group 1 is the job id
    multi_node: ClassVar[bool] = True  # its job scripts can start processes on other nodes
    allocates_cores: ClassVar[bool] = True  # a job gets cores of its own (a job sharing a node pins to those)
    allocates_mig: ClassVar[bool] = False  # it hands a job that asks for a MIG slice one (CUDA_VISIBLE_DEVICES)

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def log_file(self, job_name: str) -> str:
        """The output file the job script's directives name, relative to the folder it is submitted from."""

    def time_limit(self, limit: str) -> str:
        """The target's time limit (Slurm's syntax: ``M:S``, ``H:M:S``, ``D-H:M`` or ``D-H:M:S``) in this
        scheduler's."""
        return limit

    def output_file(self, log_file: str, job_id: str, cwd: Path) -> Path:
        """Where the output of job ``job_id`` goes."""
        path = Path(log_file)
        return path if path.is_absolute() else cwd / path

    def parse_job_id(self, stdout: str) -> str:
        """The job id in ``command``'s output."""
        text = stdout.strip().splitlines()[-1].strip() if stdout.strip() else ""
        match = self.job_id.match(text)
        if not match:
            raise SubmitFailed(f"could not read a job id from {self.command}'s output {text[:200]!r}")
        return match[1]

    def submit(self, script: Path, log_file: str, extra: Sequence[str] = ()) -> Submission:
        """Submit ``script`` (absolute) from its folder with the caller's ``extra`` options."""
        cwd = script.parent
        argv = [self.command, *self.submit_options, *extra, str(script)]
        try:
            result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                    timeout=120)
        except FileNotFoundError:
            raise SubmitFailed(f"{self.command} not found: is a {self.name} client installed on this machine?") \
                from None
        except subprocess.TimeoutExpired:
            raise SubmitFailed(f"{self.command} did not answer within 120 s") from None
        if result.returncode != 0:
            reason = " ".join((result.stderr or result.stdout).split())[:400] or f"exit status {result.returncode}"
            raise SubmitFailed(f"{self.command} refused {script}: {reason}")
        job_id = self.parse_job_id(result.stdout)
        return Submission(self.name, job_id, script, cwd, self.output_file(log_file, job_id, cwd), argv)

    @abstractmethod
    def state(self, submission: Submission) -> tuple[str | None, int | None]:
        """(final state, exit code) once the job has ended, (None, None) while it runs."""


class ArrayScheduler(Scheduler):
    """A scheduler that runs job arrays: one task per launch of ``modak tune --dispatch``, each on a node of its
    own (:class:`modak.bench.dispatch.ArrayDispatcher`)."""

    @abstractmethod
    def array_script(self, count: int, minutes: int, folder: Path, partition: str | None,
                     command: Sequence[str]) -> str:
        """A job script of ``count`` tasks, each on a node of its own for at most ``minutes``, on ``partition``
        (the scheduler's default if None): task INDEX writes its output to ``folder/INDEX.out`` and runs
        ``command`` with ``folder/INDEX.json`` as its last argument."""

    def submit_array(self, script: Path, extra: Sequence[str] = ()) -> str:
        """Submit the array ``script``; its job id. Failures are input errors naming the command."""
        argv = [self.command, *self.submit_options, *extra, str(script)]
        try:
            process = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        except FileNotFoundError:
            raise InputError(f"{self.command} not found on PATH: --dispatch {self.name} needs a {self.name} client") \
                from None
        try:
            job = self.parse_job_id(process.stdout)
        except SubmitFailed:
            job = ""
        if process.returncode != 0 or not job:
            reason = " ".join((process.stderr or process.stdout).split())[:400] or f"exit status {process.returncode}"
            raise InputError(f"{' '.join(argv)}: {reason}")
        return job

    @abstractmethod
    def queued(self, job: str) -> bool:
        """Whether any task of the array ``job`` is pending or running (an unreachable controller counts as
        queued)."""

    @abstractmethod
    def cancel(self, job: str) -> None:
        """Cancel the array ``job``."""

    @abstractmethod
    def task_states(self, job: str) -> dict[str, str]:
        """Each task's final state (with its exit code and reason), by task index."""

    def task_name(self, job: str, index: int) -> str:
        """How the scheduler names task ``index`` of ``job``."""
        return f"{job}_{index}"


SCHEDULERS: Registry[type[Scheduler]] = Registry("scheduler")
