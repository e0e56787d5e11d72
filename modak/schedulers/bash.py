"""No scheduler (``scheduler.kind: none``): the job script runs with ``bash`` on this machine, in the background."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from modak.errors import SubmitFailed
from modak.schedulers.base import SCHEDULERS, Scheduler, Submission


@SCHEDULERS.register("none")
class Bash(Scheduler):
    """``bash SCRIPT`` in a session of its own; the job id is its process id, its output ``NAME.log``."""

    template = "jobscript/bash.sh.j2"
    command = "bash"
    multi_node = False  # it runs on the node it is started on
    allocates_cores = False  # nothing splits the node: a job sharing it takes the cores modak's split gives it

    def log_file(self, job_name: str) -> str:
        return f"{job_name}.log"

    def submit(self, script: Path, log_file: str, extra: Sequence[str] = ()) -> Submission:
        cwd = script.parent
        argv = [self.command, str(script), *extra]
        try:
            process = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise SubmitFailed(f"could not start bash: {exc}") from None
        return Submission(self.name, str(process.pid), script, cwd, self.output_file(log_file, "", cwd), argv)

    def state(self, submission: Submission) -> tuple[str | None, int | None]:
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
