"""PBS (OpenPBS, PBS Pro, Torque): ``qsub`` and ``qstat -f``."""

from __future__ import annotations

import re
import subprocess

from modak.schedulers.base import SCHEDULERS, Scheduler, Submission


@SCHEDULERS.register("pbs")
class Pbs(Scheduler):
    """PBS's ``qsub``; the job's output file is ``NAME.out``, its time limit ``H:MM:SS``."""

    template = "jobscript/pbs.sh.j2"
    command = "qsub"
    job_id = re.compile(r"^(\d+(?:\[\d*\])?(?:\.[A-Za-z0-9_.-]+)?)$")

    def log_file(self, job_name: str) -> str:
        return f"{job_name}.out"

    def time_limit(self, limit: str) -> str:
        """As PBS's walltime, ``H:MM:SS``."""
        days, _, clock = limit.rpartition("-")
        parts = [int(p) for p in clock.split(":")]
        if days:
            hours, minutes, seconds = (parts + [0])[:3]
            hours += 24 * int(days)
        elif len(parts) == 2:
            hours, minutes, seconds = 0, *parts
        else:
            hours, minutes, seconds = parts
        total = (hours * 60 + minutes) * 60 + seconds
        return f"{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}"

    def state(self, submission: Submission) -> tuple[str | None, int | None]:
        result = subprocess.run(["qstat", "-f", submission.job_id], capture_output=True, text=True)
        if result.returncode != 0:
            return "UNKNOWN", None  # finished jobs leave qstat's list
        fields = dict(line.strip().split(" = ", 1) for line in result.stdout.splitlines() if " = " in line)
        if fields.get("job_state") not in ("F", "C"):
            return None, None
        code = fields.get("Exit_status", "")
        return "COMPLETED" if code == "0" else "FAILED", int(code) if code.lstrip("-").isdigit() else None
