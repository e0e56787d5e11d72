"""Hand a rendered job script to its scheduler: ``sbatch`` (Slurm), ``qsub`` (PBS) or ``bash`` (no scheduler),
parse the job id, and optionally wait for the job to end.

The job script runs the image with the target's engine (``podman run``, ``docker run`` or ``apptainer run``)
on the node, as the user who submitted it. With Podman, the image must be in that user's storage: root's
``podman`` command and root's ``podman system service`` (what ``modak build`` talks to by default) share
``/var/lib/containers/storage``, so a job submitted by root runs the image root built; another user needs
the image pushed to a registry (``modak build --push``) or built by their own rootless service.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modak.errors import InputError, SubmitFailed

SCHEDULER_COMMANDS = {"slurm": "sbatch", "pbs": "qsub", "none": "bash"}
SLURM_DONE = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                        "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})
_SLURM_ID = re.compile(r"^(\d+)(?:;\S+)?$")
_PBS_ID = re.compile(r"^(\d+(?:\[\d*\])?(?:\.[A-Za-z0-9_.-]+)?)$")


@dataclass
class Submission:
    scheduler: str  # slurm, pbs or none
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


def parse_job_id(scheduler: str, stdout: str) -> str:
    """The job id in ``sbatch --parsable`` or ``qsub`` output (``12345``, ``12345;cluster``, ``123.server``)."""
    text = stdout.strip().splitlines()[-1].strip() if stdout.strip() else ""
    pattern = {"slurm": _SLURM_ID, "pbs": _PBS_ID}[scheduler]
    match = pattern.match(text)
    if not match:
        raise SubmitFailed(f"could not read a job id from {SCHEDULER_COMMANDS[scheduler]}'s output {text[:200]!r}")
    return match[1]


def output_file(scheduler: str, log_file: str, job_id: str, cwd: Path) -> Path:
    """Where the job's output goes: the directive's file name with Slurm's ``%j`` filled in."""
    name = log_file.replace("%j", job_id.split(".")[0]) if scheduler == "slurm" else log_file
    path = Path(name)
    return path if path.is_absolute() else cwd / path


def submit(script: Path, scheduler: str, log_file: str, extra_args: list[str] | None = None) -> Submission:
    """Submit ``script`` from its folder (where the output file goes); a :class:`Submission` with the job id."""
    script = Path(script).absolute()
    cwd = script.parent
    if not script.is_file():
        raise InputError("job script not found (render or build the job first)", script)
    if scheduler not in SCHEDULER_COMMANDS:
        raise InputError(f"unknown scheduler {scheduler!r}")
    extra = list(extra_args or [])
    if scheduler == "none":
        log = cwd / log_file
        argv = ["bash", str(script), *extra]
        try:
            process = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise SubmitFailed(f"could not start bash: {exc}") from None
        return Submission("none", str(process.pid), script, cwd, log, argv)
    command = SCHEDULER_COMMANDS[scheduler]
    argv = [command, *(["--parsable"] if scheduler == "slurm" else []), *extra, str(script)]
    try:
        result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    except FileNotFoundError:
        raise SubmitFailed(f"{command} not found: is a {scheduler} client installed on this machine?") from None
    except subprocess.TimeoutExpired:
        raise SubmitFailed(f"{command} did not answer within 120 s") from None
    if result.returncode != 0:
        reason = " ".join((result.stderr or result.stdout).split())[:400] or f"exit status {result.returncode}"
        raise SubmitFailed(f"{command} refused {script}: {reason}")
    job_id = parse_job_id(scheduler, result.stdout)
    return Submission(scheduler, job_id, script, cwd, output_file(scheduler, log_file, job_id, cwd), argv)


def wait(submission: Submission, timeout: float = 600.0, poll: float = 1.0) -> Submission:
    """Wait until the job has ended; fills in ``state`` and ``exit_code`` (raises :class:`SubmitFailed` on timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        state, code = _state(submission)
        if state is not None:
            submission.state, submission.exit_code = state, code
            return submission
        if time.monotonic() > deadline:
            raise SubmitFailed(f"job {submission.job_id} did not end within {timeout:g} s")
        time.sleep(poll)


def _state(submission: Submission) -> tuple[str | None, int | None]:
    """(final state, exit code) once the job has ended, (None, None) while it runs."""
    if submission.scheduler == "none":
        pid = int(submission.job_id)
        try:
            waited, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (another process submitted it): poll for its existence
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return "COMPLETED", None
            return None, None
        if waited == 0:
            return None, None
        code = os.waitstatus_to_exitcode(status)
        return ("COMPLETED" if code == 0 else "FAILED"), code
    if submission.scheduler == "slurm":
        result = subprocess.run(["scontrol", "show", "job", "-o", submission.job_id], capture_output=True, text=True)
        if result.returncode != 0:
            if "Invalid job id" in result.stderr:  # purged after MinJobAge: it ended
                return "UNKNOWN", None
            raise SubmitFailed(f"scontrol show job {submission.job_id}: {' '.join(result.stderr.split())[:300]}")
        fields = dict(part.split("=", 1) for part in result.stdout.split() if "=" in part)
        state = fields.get("JobState", "")
        if state not in SLURM_DONE:
            return None, None
        exit_code = fields.get("ExitCode", "").split(":")[0]
        return state, int(exit_code) if exit_code.isdigit() else None
    result = subprocess.run(["qstat", "-f", submission.job_id], capture_output=True, text=True)
    if result.returncode != 0:
        return "UNKNOWN", None  # finished jobs leave qstat's list
    fields = dict(line.strip().split(" = ", 1) for line in result.stdout.splitlines() if " = " in line)
    if fields.get("job_state") not in ("F", "C"):
        return None, None
    code = fields.get("Exit_status", "")
    return "COMPLETED" if code == "0" else "FAILED", int(code) if code.lstrip("-").isdigit() else None
