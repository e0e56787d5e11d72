"""The typed build description: one IR from which every template family (Dockerfile, definition file,
entrypoint, job script) is rendered.

Build files get names the spec constrains (job and target names, image references, scheduler words) and data
modak produces itself (numbers, fixed paths, JSON). The user's file names and the ONNX file's path never appear
in them: those files are copied into folders of the build context under fixed names. The free text that has
to appear (the command, the data path, the model's input names inside JSON) is escaped by the templates'
filters (see :mod:`modak.render.render`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import modak
from modak import schedulers
from modak.documents import encoded
from modak.image.deployment import IMAGE_LOCATIONS, MODEL_DIR, MODEL_FILE, PLAN_FILE
from modak.render.package import source_digest, wheel_name
from modak.render.sharing import Sharing
from modak.spec.loader import read_catalog
from modak.spec.resolve import APP_DIR, DataBind
from modak.workload.processing import processing_files

if TYPE_CHECKING:
    from modak.plan import Plan
    from modak.spec.loader import LoadedJob

# Where things live in the image.
VENV = "/opt/venv"
ENTRYPOINT = "/opt/modak/entrypoint.sh"
LOCK_FILE = "/opt/modak/requirements.lock"  # what pip resolved (``pip freeze --all`` in the pip step)
LOCK_LABEL = "io.modak.requirements-lock"  # the image's label of the lock's digest (sha256:...)
# What Apptainer's mksquashfs is given (`apptainer build --mksquashfs-args`) for each container.sif_compression;
# None: nothing, Apptainer's default (gzip, level 9). Measured in perfmodels/README.md ("SIF compression").
MKSQUASHFS_ARGS: dict[str, str | None] = {
    "gzip": None,
    "gzip-fast": "-comp gzip -Xcompression-level 1",
    "zstd": "-comp zstd -Xcompression-level 3",
}
# Where the CA bundle and the wheelhouse are visible during the pip step only: a bind mount in a Dockerfile,
# a folder that %post removes in a definition file (%files cannot target /tmp).
DOCKER_BUILD_MOUNT = "/run/modak"
DEF_BUILD_DIR = "/opt/modak-build"

# The build context's top-level entries: the generated files and the folders and files copied into the images.
RUNTIME_CONTEXT, MODEL_CONTEXT, APP_CONTEXT = "modak-wheel", "model", "app"
WHEELS_CONTEXT, CA_CONTEXT = "wheels", "ca.crt"
# A local base image (``localhost/...``: no registry serves it) as a docker-archive in the build context, which a
# definition file bootstraps from; made by the engine before an Apptainer build (not a rendered file).
BASE_ARCHIVE = "base-image.tar"
LOCAL_IMAGES = "localhost/"
CONTEXT_ENTRIES = (RUNTIME_CONTEXT, MODEL_CONTEXT, APP_CONTEXT, WHEELS_CONTEXT, CA_CONTEXT)

BASE_APT = ("python3", "python3-venv", "python3-pip", "ca-certificates")
SERVE_COMMAND = ("modak", "serve")  # the default command of inference images
SELF_TEST_COMMAND = ("modak", "self-test")  # the default of training images without a command; the smoke test
SERVE_PORT = 8080
RENDEZVOUS_PORT = 29500  # torchrun's c10d rendezvous on the first node of a job of several nodes
USER_NAME = "modak"
USER_UID = 1000
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Image:
    """The image to build: repository name, tag and full reference."""

    name: str
    tag: str
    ref: str


@dataclass(frozen=True)
class BaseImage:
    logical: str  # the recipe's name for it (debian, cuda)
    ref: str
    gcc: str | None  # version of the image's gcc (recipes/base_images.yaml); None when modak does not know it
    archive: str | None = None  # context path of its docker-archive, for a local image (BASE_ARCHIVE); None: pulled


@dataclass(frozen=True)
class PipStep:
    """The one pip install of the build: pinned requirements and where packages come from."""

    requirements: tuple[str, ...]
    index_url: str | None
    extra_index_urls: tuple[str, ...]
    ca_bundle: str | None  # path of the CA bundle in the build context
    wheelhouse: str | None  # folder of wheels in the build context

    def mounts(self) -> tuple[str, ...]:
        """Context paths the pip step needs (bind-mounted in a Dockerfile, copied in a definition file)."""
        return tuple(p for p in (self.ca_bundle, self.wheelhouse) if p)

    def env(self, build_dir: str) -> tuple[tuple[str, str], ...]:
        """Variables set for the pip command alone, with the build files under ``build_dir``."""
        return (("PIP_CERT", f"{build_dir}/{self.ca_bundle}"),) if self.ca_bundle else ()

    def argv(self, build_dir: str) -> tuple[str, ...]:
        """The pip command, with the build files under ``build_dir``."""
        argv = [f"{VENV}/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
        if self.index_url:
            argv += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            argv += ["--extra-index-url", url]
        if self.wheelhouse:
            argv += ["--find-links", f"{build_dir}/{self.wheelhouse}"]
        return (*argv, *self.requirements)


@dataclass(frozen=True)
class ContextItem:
    """A file or folder this machine copies into the build context (``path`` is relative to the context)."""

    source: Path
    path: str
    skip: tuple[str, ...] = ()  # names left out anywhere below a copied folder


@dataclass(frozen=True)
class Copy:
    """One COPY / %files line: a context path to a path in the image."""

    source: str
    destination: str


@dataclass(frozen=True)
class JobScript:
    """What the scheduler script needs: directives, the engine and how to start the image."""

    scheduler: str  # a registered scheduler's name (modak.schedulers)
    name: str
    partition: str | None
    account: str | None
    qos: str | None
    time_limit: str  # the target's, in the scheduler's syntax
    nodes: int
    cpus_per_task: int
    gpus: int
    engine: str
    image: str
    sif: str  # default image file for Apptainer (MODAK_SIF overrides it)
    data: DataBind | None
    log_file: str
    # what the script runs when given no arguments, instead of the image's default command: a batch job cannot
    # run a server that never ends, so an inference image's job runs batch inference into the job's results
    # folder (data.output), else its self-test (``modak run ...`` as arguments runs batch inference); a job of
    # several workers hands the job's command to torchrun; empty: the image's default command
    default_command: tuple[str, ...] = ()
    # data-parallel training (the job's ``scaling``, :mod:`modak.scaling`): processes in all and per node,
    # each started by torchrun (one torchrun per node); 1: one process, as the plan measured it
    workers: int = 1
    workers_per_node: int = 1
    scaling_summary: str = ""  # one line: the chosen worker count and its predicted efficiency
    rendezvous_port: int = RENDEZVOUS_PORT
    sharing: Sharing | None = None  # how it shares its node or GPU with other jobs (``modak pack``); None: it does not


@dataclass(frozen=True)
class BuildDescription:
    """Everything the templates render, in the order the layers are built."""

    summary: str  # one line: job, target and chosen candidate
    image: Image
    base: BaseImage
    apt_packages: tuple[str, ...]
    build_env: tuple[tuple[str, str], ...]  # baked, and set for the pip step (compiler flags of the target)
    pip: PipStep
    copies: tuple[Copy, ...]
    runtime_env: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    command: tuple[str, ...]
    self_test: tuple[str, ...]  # the smoke test's command (the build's, and a definition file's %test)
    context: tuple[ContextItem, ...]
    job: JobScript
    plan_document: str  # plan.json: the plan, with the chosen deployment the entrypoint applies
    runtime_wheel: str  # context path of modak's in-image package (:mod:`modak.render.package`), built by render
    runtime_digest: str  # its sources' sha256, named in the install step so that a layer cache sees a change
    ports: tuple[int, ...] = ()  # what the default command listens on
    templates: tuple[Path, ...] = ()  # site template folders, in front of modak's own
    mksquashfs_args: str | None = None  # a SIF build's `--mksquashfs-args` (the target's container.sif_compression)
    venv: str = VENV
    path_prepend: str = f"{VENV}/bin"
    entrypoint: str = ENTRYPOINT
    plan_file: str = PLAN_FILE
    lock_file: str = LOCK_FILE
    lock_label: str = LOCK_LABEL
    workdir: str = APP_DIR
    user: str = USER_NAME
    uid: int = USER_UID
    docker_build_mount: str = DOCKER_BUILD_MOUNT
    def_build_dir: str = DEF_BUILD_DIR

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        """Every baked variable except PATH (which templates prepend ``path_prepend`` to)."""
        return self.build_env + self.runtime_env

    def runtime_install(self, build_dir: str) -> tuple[str, ...]:
        """The pip command installing modak's in-image package from ``build_dir`` (after the pinned dependencies:
        no index, no dependencies)."""
        return (f"{self.venv}/bin/pip", "install", "--no-deps", "--no-index", "--no-cache-dir",
                "--disable-pip-version-check", f"{build_dir}/{self.runtime_wheel}")


def build_description(plan: Plan, created: str | None = None, sharing: Sharing | None = None) -> BuildDescription:
    """The build description of the plan's chosen candidate (the plan's inputs were checked when it was made);
    ``sharing``: how its job script shares the node or GPU with other jobs (``modak pack``)."""
    loaded = plan.loaded
    job, target = loaded.job, loaded.target
    candidate = plan.choice.candidate
    recipe = plan.recipe()
    needs = recipe.container[candidate.device]
    digest = plan.digest()
    name = _repository(job.name)
    tag = f"{candidate.runtime}-{digest[:12]}"
    registry = target.container.registry
    image = Image(name, tag, f"{registry.rstrip('/') if registry else 'localhost/modak'}/{name}:{tag}")
    base = _base_image(needs.base, loaded)
    apt = [*BASE_APT, *needs.apt, *(pkg for p, key in recipe.chosen(candidate) for pkg in p.apt.get(key, ()))]

    # An int8 choice ships its quantized model (one file) instead of the job's.
    quantized = plan.choice.accuracy is not None
    model_file = plan.model_file()
    context = []
    if model_file is not None:  # None: the user's own model that no exporter could export
        context.append(ContextItem(model_file, f"{MODEL_CONTEXT}/{MODEL_FILE}"))
        context += [ContextItem(model_file.parent / location, f"{MODEL_CONTEXT}/{location}")
                    for location in (() if quantized else plan.source.data_files)]
    if recipe.model_format == "torch":  # the user's own module: the PyTorch runtimes build it beside the graph
        context += [ContextItem(path, f"{MODEL_CONTEXT}/{path.name}", ("__pycache__",)) for path in plan.user_files()]
    files = loaded.files
    # every runtime's image serves raw items through them (Deployment.tokenizer, image_processor, preprocess...)
    copied = {item.source for item in context}
    context += [ContextItem(path, f"{MODEL_CONTEXT}/{path.name}", ("__pycache__",))
                for path in processing_files(plan.loaded) if path not in copied]
    if files.ca_bundle:
        context.append(ContextItem(files.ca_bundle, CA_CONTEXT))
    context += [ContextItem(wheel, f"{WHEELS_CONTEXT}/{wheel.name}") for wheel in files.wheels]
    context += [ContextItem(path, f"{APP_CONTEXT}/{path.name}") for path in files.app_files]
    copies = [Copy(MODEL_CONTEXT, MODEL_DIR), Copy("entrypoint.sh", ENTRYPOINT), Copy("plan.json", PLAN_FILE)]
    if files.app_files:
        copies.append(Copy(APP_CONTEXT, APP_DIR))
    flags = plan.ceilings.compiler_flags(base.gcc) if base.gcc else ""
    serving = _serves(job)
    if job.entrypoint and job.entrypoint.command:
        command = tuple(job.entrypoint.command)
    else:
        command = SERVE_COMMAND if serving else SELF_TEST_COMMAND
    runtime_env = (*IMAGE_LOCATIONS.items(), *((("MODAK_PORT", str(SERVE_PORT)),) if serving else ()))
    return BuildDescription(
        summary=f"job {job.name} on target {target.name}: {candidate.name}",
        image=image, base=base, apt_packages=tuple(_unique(apt)),
        build_env=(("CFLAGS", flags), ("CXXFLAGS", flags)) if flags else (), pip=_pip_step(plan),
        copies=tuple(copies), runtime_env=runtime_env, labels=_labels(plan, image, base, created),
        command=command, self_test=self_test_command(job.task.value),
        context=tuple(context), job=_job_script(plan, image, command, sharing),
        plan_document=json.dumps(plan.to_dict(), sort_keys=True, indent=2) + "\n",
        runtime_wheel=f"{RUNTIME_CONTEXT}/{wheel_name()}", runtime_digest=source_digest(),
        ports=(SERVE_PORT,) if serving else (),
        templates=files.templates, mksquashfs_args=MKSQUASHFS_ARGS[target.container.sif_compression])


def self_test_command(task: str) -> tuple[str, ...]:
    """The smoke test's command for a job of ``task``: the self-test, which for inference also serves one request."""
    return (*SELF_TEST_COMMAND, *(("--serve",) if task == "inference" else ()))


def _pip_step(plan: Plan) -> PipStep:
    """The recipe's pins, what modak's in-image package needs, the job's requirements, and the target's package
    sources."""
    recipe, job, python = plan.recipe(), plan.loaded.job, plan.loaded.target.python
    needs = recipe.container[plan.choice.candidate.device]
    pins = [_compact(r) for r in needs.pip]
    pinned = {_project(r) for r in pins}
    uses = (job.task.value, *(use for use in ("tokenizer", "image_processor") if getattr(job.model, use)))
    pins += [r for r in image_requirements(*uses) if _project(r) not in pinned]
    pins += [_compact(r) for r in (job.entrypoint.requirements if job.entrypoint else [])]
    recipe_index = [needs.pip_index_url] if needs.pip_index_url and python.recipe_indexes else []
    extra = recipe_index + list(python.extra_index_urls)
    files = plan.loaded.files
    return PipStep(requirements=tuple(_unique(pins)), index_url=python.index_url,
                   extra_index_urls=tuple(_unique(extra)), ca_bundle=CA_CONTEXT if files.ca_bundle else None,
                   wheelhouse=WHEELS_CONTEXT if files.wheels else None)


def image_requirements(*uses: str) -> tuple[str, ...]:
    """What modak's in-image package needs in images for ``uses`` (``recipes/image.yaml``: every image's, then
    each use's: the task, ``tokenizer``, ``image_processor``; all of them when none is given); a recipe's own pin
    of the same project wins."""
    pins = read_catalog("image.yaml")
    uses = uses or tuple(k for k in pins if k != "requirements")
    return (*pins["requirements"], *(r for use in uses for r in pins.get(use, ())))


def _labels(plan: Plan, image: Image, base: BaseImage, created: str | None) -> tuple[tuple[str, str], ...]:
    """OCI annotations and modak's decision (runtime, parameters, target, prediction, plan digest; the user's own
    model's source, exporter and digests)."""
    job, target = plan.loaded.job, plan.loaded.target
    candidate, prediction = plan.choice.candidate, plan.choice.prediction
    created = created or _created(plan)
    return (
        ("org.opencontainers.image.title", job.name),
        ("org.opencontainers.image.description",
         f"{job.task.value} job {job.name} on {target.name}: {candidate.name} (built by modak)"),
        ("org.opencontainers.image.version", image.tag),
        ("org.opencontainers.image.created", created),
        ("org.opencontainers.image.base.name", base.ref),
        ("io.modak.version", modak.__version__),
        ("io.modak.runtime", candidate.runtime),
        ("io.modak.device", candidate.device),
        ("io.modak.precision", candidate.precision.value),
        ("io.modak.parameters", _json(dict(candidate.params))),
        ("io.modak.target", target.name),
        ("io.modak.predicted-step-seconds", f"{prediction.step_seconds:.6g}"),
        ("io.modak.predictor", prediction.predictor),
        ("io.modak.chosen-by", plan.chosen_by),
        ("io.modak.plan-digest", plan.digest()),
        *((("io.modak.quantized-model", _json(encoded(plan.choice.accuracy.record()))),)
          if plan.choice.accuracy else ()),
        *((("io.modak.model-source", _json(encoded(plan.source.user.record()))),) if plan.source.user else ()),
        *((("io.modak.tuned", _json({"step-seconds": plan.tuned.step_s, "interval-seconds":
                                     [plan.tuned.ci_low_s, plan.tuned.ci_high_s], "confident": plan.tuned.confident,
                                     "trials": plan.tuned.trials, "measured-at": plan.tuned.measured_at})),)
          if plan.tuned else ()),
    )


def _created(plan: Plan) -> str:
    """The ``created`` label: ``$SOURCE_DATE_EPOCH`` when set, else the newest modification time of the job's
    own inputs (job and target files, the ONNX file or the user's model files, the entrypoint files).

    Not the time of rendering: the label is a layer of the image, and a render of unchanged inputs must produce
    the same Dockerfile so that a rebuild reuses every cached layer.
    """
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch.isdigit():
        stamp = float(epoch)
    else:
        source = plan.source
        graph = [source.onnx_path] if source.onnx_path and source.zoo is None and source.user is None else []
        paths = [*plan.loaded.files.inputs(), *graph, *plan.user_files(), *processing_files(plan.loaded)]
        stamps = [p.stat().st_mtime for p in paths if p.exists()]
        stamp = max(stamps) if stamps else 0.0
    moment = datetime.fromtimestamp(int(stamp), UTC)
    return moment.isoformat().replace("+00:00", "Z")


def _repository(name: str) -> str:
    """A job name as an OCI repository path component (lower case, separators ., _, __ or dashes)."""
    name = re.sub(r"[._-]{2,}", lambda m: m[0] if m[0] == "__" or set(m[0]) == {"-"} else "-", name.lower())
    return name.rstrip("._-")


def _base_image(logical: str, loaded: LoadedJob) -> BaseImage:
    """The target's image for a recipe's logical base name, else the shipped default; the shipped entry's gcc."""
    default = read_catalog("base_images.yaml").get(logical)
    mapped = loaded.target.container.base_images.get(logical)
    if mapped is None and default is None:
        raise loaded.target_doc.error(("container", "base_images"),
                                      f"the chosen runtime needs base image '{logical}', which has no default: "
                                      f"map it to an image reference here")
    ref = mapped or default["image"]
    return BaseImage(logical, ref, default["gcc"] if default else None,
                     BASE_ARCHIVE if ref.startswith(LOCAL_IMAGES) else None)


def _job_script(plan: Plan, image: Image, command: tuple[str, ...], sharing: Sharing | None = None) -> JobScript:
    loaded = plan.loaded
    job, target = loaded.job, loaded.target
    settings, engine = target.scheduler, target.container.engine
    scheduler = schedulers.scheduler(settings.kind)
    gpu = plan.choice.candidate.device == "gpu"
    script = JobScript(
        scheduler=settings.kind, name=job.name, partition=settings.partition, account=settings.account,
        qos=settings.qos, time_limit=scheduler.time_limit(settings.time_limit),
        nodes=1,  # the plan runs one process on one node
        cpus_per_task=plan.ceilings.cores,
        gpus=(1 if sharing and sharing.gpu else plan.ceilings.gpu_count) if gpu else 0,
        engine=engine, image=image.ref, sif=f"{image.name}.sif", data=loaded.files.data,
        log_file=scheduler.log_file(job.name), default_command=_job_command(job, loaded.files.data), sharing=sharing)
    chosen = plan.data_parallel
    if chosen is None or sharing is not None:  # a job sharing a node or GPU (modak pack) runs one process
        return script
    if chosen.workers == 1:
        return replace(script, scaling_summary=chosen.summary)
    return replace(script, nodes=chosen.nodes, gpus=chosen.per_node if gpu else 0, workers=chosen.workers,
                   workers_per_node=chosen.per_node, default_command=command, scaling_summary=chosen.summary)


def _job_command(job: Any, data: DataBind | None) -> tuple[str, ...]:
    """What the job script runs given no arguments. A batch job cannot run a server that never ends: an inference
    image's job runs batch inference from the data set into the results folder when the job gives both, else its
    self-test. Other images: their default command (empty)."""
    if not _serves(job):
        return ()
    if data is not None and data.output is not None:
        return ("modak", "run", "--input", data.mount, "--output", data.output_mount)
    return SELF_TEST_COMMAND


def _serves(job: Any) -> bool:
    """Whether the image's default command is the server (an inference job without a command of its own)."""
    return job.task.value == "inference" and not (job.entrypoint and job.entrypoint.command)


def _compact(requirement: str) -> str:
    """A requirement without whitespace (insignificant in PEP 508 specifiers; keeps every build line one line)."""
    return "".join(requirement.split())


def _project(requirement: str) -> str:
    match = _PROJECT.match(requirement)
    return (match[0] if match else requirement).lower().replace("_", "-")


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
