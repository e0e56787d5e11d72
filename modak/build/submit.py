"""Hand a rendered job script to its scheduler (:mod:`modak.schedulers`: ``sbatch``, ``qsub`` or ``bash``) and
optionally wait for the job to end.

The job script runs the image with the target's engine (``podman run``, ``docker run`` or ``apptainer run``)
on the node, as the user who submitted it. With Podman, the image must be in that user's storage: root's
``podman`` command and root's ``podman system service`` (what ``modak build`` talks to by default) share
``/var/lib/containers/storage``, so a job submitted by root runs the image root built; another user needs
the image pushed to a registry (``modak build --push``) or built by their own rootless service.
"""

from __future__ import annotations

import time
from pathlib import Path

from modak.errors import InputError, SubmitFailed
from modak.schedulers import Submission, scheduler


def submit(script: Path, scheduler_name: str, log_file: str, extra_args: list[str] | None = None) -> Submission:
    """Submit ``script`` from its folder (where the output file goes) to the scheduler called ``scheduler_name``;
    a :class:`Submission` with the job id."""
    script = Path(script).absolute()
    if not script.is_file():
        raise InputError("job script not found (render or build the job first)", script)
    return scheduler(scheduler_name).submit(script, log_file, list(extra_args or []))


def wait(submission: Submission, timeout: float = 600.0, poll: float = 1.0) -> Submission:
    """Wait until the job has ended; fills in ``state`` and ``exit_code`` (raises :class:`SubmitFailed` on timeout)."""
    deadline = time.monotonic() + timeout
    where = scheduler(submission.scheduler)
    while True:
        state, code = where.state(submission)
        if state is not None:
            submission.state, submission.exit_code = state, code
            return submission
        if time.monotonic() > deadline:
            raise SubmitFailed(f"job {submission.job_id} did not end within {timeout:g} s")
        time.sleep(poll)
