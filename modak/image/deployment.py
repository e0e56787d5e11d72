"""The deployment environment: one definition, applied by the image's entrypoint and by ``modak bench``.

A :class:`Deployment` is what the plan decided for one candidate, free of locations: runtime, device,
precision, task, parameter values (threads symbolic: ``all``, ``half`` or a number), the environment the
chosen values set (from the runtime's recipe), batch size and input shapes. :func:`environment` turns it into
the process environment for the real allocation: CPUs from Slurm, PBS, the cgroup quota or the affinity mask,
threads from the policy, the thread variables of every library, the pools' wait policy, OpenMP thread pinning
where the affinity mask is the allocation and the threads spin, the recipe's variables, a preloaded allocator.

Where things are comes from the environment, so that the same code runs in the image and on the host:
``MODAK_PLAN`` (the JSON file with a ``deployment`` object: the image's ``plan.json``), ``MODAK_MODEL`` (the ONNX
file), ``MODAK_WORKDIR`` (a writable folder). At run time ``MODAK_THREADS_POLICY`` overrides the plan's threads
policy and ``MODAK_CGROUP_ROOT`` the cgroup folder (default ``/sys/fs/cgroup``). Standard library only: this runs
before every command of the image.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PLAN_VARIABLE = "MODAK_PLAN"
MODEL_VARIABLE = "MODAK_MODEL"
WORKDIR_VARIABLE = "MODAK_WORKDIR"
# Where an image keeps them (its ENV names these; the harness sets the variables to host paths instead).
PLAN_FILE = "/opt/modak/plan.json"
MODEL_DIR = "/opt/modak/model"
MODEL_FILE = "model.onnx"  # the ONNX file's name in the image; external data files keep their own names
WORK_DIR = "/tmp/modak"  # writable under Docker, Podman and Apptainer (whose images are read-only)
IMAGE_LOCATIONS = {PLAN_VARIABLE: PLAN_FILE, MODEL_VARIABLE: f"{MODEL_DIR}/{MODEL_FILE}", WORKDIR_VARIABLE: WORK_DIR}
THREAD_VARIABLES = ("MODAK_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TVM_NUM_THREADS")
PRELOAD = "MODAK_PRELOAD"  # a recipe variable: a library (file name) to put in front of LD_PRELOAD
LIBRARY_GLOBS = ("/usr/lib*/{}", "/usr/lib*/*/{}")  # e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
_COUNT = re.compile(r"[1-9][0-9]{0,5}")


class DeploymentError(Exception):
    """The deployment cannot be applied here (a missing library, an unreadable plan)."""


_OPTIONAL = ("pytorch", "loss", "tokenizer", "image_processor", "preprocess", "postprocess")  # left out when None


@dataclass(frozen=True)
class Deployment:
    """One candidate as the image runs it (JSON: the ``deployment`` object of ``plan.json``)."""

    runtime: str
    device: str  # cpu | gpu
    precision: str
    task: str  # inference | training
    params: Mapping[str, Any]
    env: Mapping[str, str]  # variables the chosen parameter values set (the recipe's ``env``)
    batch_size: int
    input_shapes: Mapping[str, list[int]]  # per sample, no batch dimension
    zoo: str | None = None  # the zoo architecture (PyTorch runtimes build it), else None
    # The user's own model, which the PyTorch runtimes build from files beside the model file (the image's model
    # folder): {"module": file or dotted name, "factory", "kwargs", "weights": file or None}, or {"program": file}
    # (a torch.export program); None for an ONNX file or a zoo architecture.
    pytorch: Mapping[str, Any] | None = None
    # The training step's loss (job.loss): a built-in (cross_entropy, mse) or "module:function" with the module
    # beside the model file; None: the mean square of the outputs.
    loss: str | None = None
    # The job's tokenizer (model.tokenizer): {"folder": its name beside the model file, "max_length"}; served
    # models take text then (modak.image.text).
    tokenizer: Mapping[str, Any] | None = None
    # The job's image processor (model.image_processor): {"folder": its name beside the model file}; served models
    # take encoded images then (modak.image.vision).
    image_processor: Mapping[str, Any] | None = None
    # The user's pre-processing (model.preprocess): {"function": "module:function" with the module beside the model
    # file, "example": the example item's file name beside it}; served models take raw items (modak.image.functions).
    preprocess: Mapping[str, Any] | None = None
    postprocess: str | None = None  # the user's post-processing (model.postprocess): "module:function", as above

    @property
    def threads_policy(self) -> str:
        """``all`` (the default), ``half`` or a number."""
        return str(self.params.get("threads", "all")).lower()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["params"], data["env"] = dict(self.params), dict(self.env)
        data["input_shapes"] = {k: list(v) for k, v in self.input_shapes.items()}
        for key in _OPTIONAL:  # plans of ONNX files and zoo models are what they were
            if data[key] is None:
                del data[key]
        for key in ("pytorch", "tokenizer", "image_processor", "preprocess"):
            if data.get(key) is not None:
                data[key] = dict(data[key])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Deployment:
        return cls(**data)


def location(variable: str, environ: Mapping[str, str] = os.environ) -> str:
    """The plan file, model file or work folder: the variable's value, else where an image keeps it."""
    return environ.get(variable) or IMAGE_LOCATIONS[variable]


def read_deployment(path: str | Path) -> Deployment:
    """The ``deployment`` object of a plan file."""
    try:
        return Deployment.from_dict(json.loads(Path(path).read_text(encoding="utf-8"))["deployment"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DeploymentError(f"cannot read the deployment from {path}: {type(exc).__name__}: {exc}") from None


def allocation_cpus(environ: Mapping[str, str] = os.environ, cgroup: Path = Path("/sys/fs/cgroup")) -> tuple[int, str]:
    """The CPUs this process was given and where that number came from: Slurm's ``SLURM_CPUS_PER_TASK``, PBS's
    ``NCPUS``, the cgroup v2 ``cpu.max`` quota, the cgroup v1 CFS quota, then the affinity mask."""
    for variable in ("SLURM_CPUS_PER_TASK", "NCPUS"):
        if _COUNT.fullmatch(environ.get(variable, "")):
            return int(environ[variable]), variable
    quota = _quota_cpus(cgroup / "cpu.max", None)
    if quota:
        return quota, "cgroup v2 cpu.max"
    for folder in (cgroup / "cpu", cgroup):
        quota = _quota_cpus(folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us")
        if quota:
            return quota, "cgroup v1 quota"
    return len(os.sched_getaffinity(0)), "affinity"


def _quota_cpus(quota_file: Path, period_file: Path | None) -> int | None:
    """CPUs a CFS quota allows (at least 1); None when there is no quota (``max``, -1) or no file."""
    try:
        words = quota_file.read_text().split()
        if period_file is not None:
            words = words[:1] + period_file.read_text().split()[:1]
    except OSError:
        return None
    if len(words) < 2 or not all(w.isdigit() for w in words[:2]) or int(words[1]) == 0:
        return None
    return max(1, int(words[0]) // int(words[1]))


def resolve_threads(policy: object, cpus: int) -> int:
    """Threads for a policy on ``cpus`` CPUs: ``all``, ``half`` or a number (at most ``cpus``, at least 1).

    The one thread policy: the planner resolves it on the target's cores, the entrypoint on the allocation."""
    text = str(policy).lower()
    if text == "all":
        return cpus
    if text == "half":
        return max(1, cpus // 2)
    if text.isdigit():
        return max(1, min(int(text), cpus))
    raise DeploymentError(f"unknown threads policy {policy!r} (all, half or a number)")


def policy(deployment: Deployment, environ: Mapping[str, str] = os.environ) -> str:
    """The threads policy in force: ``MODAK_THREADS_POLICY`` when set, else the deployment's."""
    return environ.get("MODAK_THREADS_POLICY") or deployment.threads_policy


WAIT_VARIABLE = "MODAK_WAIT_POLICY"
WAIT_POLICIES = ("spin", "passive")


def wait_policy(deployment: Deployment, environ: Mapping[str, str] = os.environ) -> str:
    """How idle pool threads wait, explicitly: ``spin`` (busy-wait: lowest latency on cores of one's own) or
    ``passive`` (sleep: for cores shared with other work). ``MODAK_WAIT_POLICY`` overrides the deployment's
    ``wait_policy`` parameter (the recipes' choice for the target's allocation); the default is ``spin``. OpenMP
    pools (PyTorch, ``OMP_WAIT_POLICY``) and ONNX Runtime (its sessions' ``allow_spinning``) honor it."""
    value = str(environ.get(WAIT_VARIABLE) or deployment.params.get("wait_policy", "spin")).lower()
    if value not in WAIT_POLICIES:
        raise DeploymentError(f"unknown wait policy {value!r} ({' or '.join(WAIT_POLICIES)})")
    return value


def find_library(name: str) -> str | None:
    """The first installed file named ``name`` under /usr/lib*/ (two levels), or None."""
    found = sorted(path for pattern in LIBRARY_GLOBS for path in glob.glob(pattern.format(name)))
    return found[0] if found else None


def environment(deployment: Deployment, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables to set for ``deployment`` on this allocation (added to ``environ``, which is not changed)."""
    cpus, source = allocation_cpus(environ, Path(environ.get("MODAK_CGROUP_ROOT") or "/sys/fs/cgroup"))
    threads = resolve_threads(policy(deployment, environ), cpus)
    env = {"MODAK_CPUS": str(cpus), "MODAK_CPUS_FROM": source, **{name: str(threads) for name in THREAD_VARIABLES}}
    wait = wait_policy(deployment, environ)
    env.update({WAIT_VARIABLE: wait, "OMP_WAIT_POLICY": "ACTIVE" if wait == "spin" else "PASSIVE"})
    if wait == "spin" and len(os.sched_getaffinity(0)) == cpus:
        # Cores of one's own whose mask is the allocation: pin OpenMP threads to them. On shared cores (passive)
        # threads stay free to move away from a core the other work holds.
        env.update(OMP_PROC_BIND="close", OMP_PLACES="cores")
    env.update({k: v for k, v in deployment.env.items() if k != PRELOAD})
    library = deployment.env.get(PRELOAD)
    if library:
        path = find_library(library)
        if path is None:
            raise DeploymentError(f"the deployment preloads {library}, which is not installed under /usr/lib*/ "
                                  "(Debian: apt-get install libjemalloc2)")
        previous = environ.get("LD_PRELOAD")
        env["LD_PRELOAD"] = f"{path}:{previous}" if previous else path
    return env
