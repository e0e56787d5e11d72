"""Slurm: ``sbatch --parsable``, ``scontrol`` for a job's state, and job arrays for ``modak tune --dispatch slurm``."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from modak.errors import SubmitFailed
from modak.schedulers.base import SCHEDULERS, ArrayScheduler, Submission

DONE = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                  "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})


@SCHEDULERS.register("slurm")
class Slurm(ArrayScheduler):
    """Slurm's ``sbatch``; the job's output file is ``NAME-JOBID.out``."""

    template = "jobscript/slurm.sh.j2"
    command = "sbatch"
    submit_options = ("--parsable",)
    job_id = re.compile(r"^(\d+)(?:;\S+)?$")
    allocates_mig = True  # --gres=gpu:PROFILE:1

    def log_file(self, job_name: str) -> str:
        return f"{job_name}-%j.out"

    def output_file(self, log_file: str, job_id: str, cwd: Path) -> Path:
        """The directive's file name with ``%j`` filled in."""
        return super().output_file(log_file.replace("%j", job_id.split(".")[0]), job_id, cwd)

    def state(self, submission: Submission) -> tuple[str | None, int | None]:
        result = subprocess.run(["scontrol", "show", "job", "-o", submission.job_id], capture_output=True, text=True)
        if result.returncode != 0:
            if "Invalid job id" in result.stderr:  # purged after MinJobAge: it ended
                return "UNKNOWN", None
            raise SubmitFailed(f"scontrol show job {submission.job_id}: {' '.join(result.stderr.split())[:300]}")
        fields = dict(part.split("=", 1) for part in result.stdout.split() if "=" in part)
        state = fields.get("JobState", "")
        if state not in DONE:
            return None, None
        exit_code = fields.get("ExitCode", "").split(":")[0]
        return state, int(exit_code) if exit_code.isdigit() else None

    def array_script(self, count: int, minutes: int, folder: Path, partition: str | None,
                     command: Sequence[str]) -> str:
        # --exclusive: a measurement needs its node to itself, so two launches never share one.
        directives = [f"--array=0-{count - 1}", "--exclusive", f"--time={minutes}", "--job-name=modak-bench",
                      f"--output={folder}/%a.out"] + ([f"--partition={partition}"] if partition else [])
        spec = f"{shlex.quote(str(folder))}/$SLURM_ARRAY_TASK_ID.json"
        return "\n".join(["#!/bin/bash", *(f"#SBATCH {d}" for d in directives),
                          f"exec {shlex.join(command)} {spec}", ""])

    def queued(self, job: str) -> bool:
        process = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True)
        if process.returncode != 0:
            return "Invalid job id" not in process.stderr  # purged: it ended long ago
        return bool(process.stdout.strip())

    def cancel(self, job: str, wait_s: float = 60.0) -> None:
        """``scancel``, then wait (up to ``wait_s``) until the tasks have left the queue."""
        subprocess.run(["scancel", job], capture_output=True)
        deadline = time.monotonic() + wait_s
        while self.queued(job) and time.monotonic() < deadline:
            time.sleep(0.5)

    def task_states(self, job: str) -> dict[str, str]:
        """From ``scontrol`` (it needs no accounting and keeps ended jobs for ``MinJobAge``)."""
        process = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
        states = {}
        for line in process.stdout.splitlines():
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
            reason = fields.get("Reason", "None")
            states[fields.get("ArrayTaskId", "")] = (fields.get("JobState", "UNKNOWN")
                                                     + f" exit {fields.get('ExitCode')}"
                                                     + (f" ({reason})" if reason != "None" else ""))
        return states
