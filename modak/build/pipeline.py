"""``modak build``: render -> build -> label -> smoke test -> tag -> push -> archive.

1. **Render** the plan's build context into the output folder (see :mod:`modak.render`), plus a
   ``.dockerignore`` that keeps modak's own outputs (logs, archives, SIF files) out of the build context.
2. **Build** it with the chosen engine, streaming the log to ``OUT_DIR/build.log`` and to the progress display.
3. **Label**: read back the lock of what pip resolved (``/opt/modak/requirements.lock``, written by the pip
   step), save it as ``OUT_DIR/requirements.lock`` and add the label ``io.modak.requirements-lock`` (its
   sha256) in a second tiny stage (``FROM`` the built image, ``LABEL`` only: cached when nothing changed).
   The runtime's tuned artifacts are added in the same stage where there are any (see :func:`tuned_artifacts`).
   An engine whose images cannot change after their build (Apptainer) keeps the image as it is
   (:meth:`Engine.add_layer <modak.build.engines.Engine.add_layer>`).
4. **Smoke test** (unless ``smoke=False``): run the image's entrypoint with ``modak self-test`` (plus
   ``--serve`` for inference images: the server started in the container answers one real infer request); it
   times at least 20 steps after warm-up and prints one JSON line (runtime, threads, median and spread, the
   plan's predicted interval and a sentence saying whether the median falls inside it), which must say
   ``status: ok`` and name the plan's runtime. A median outside the interval is reported, not a failure.
5. **Tag** the image with the engine's name for it (the plan's reference; a SIF file for Apptainer), only now:
   a failed or interrupted build, or a failed smoke test, leaves no tag.
6. **Push** (``push=True``) to the target's registry, then pull the reference back and compare its labels; the
   registry login comes from the environment or the Docker/Podman auth files (:mod:`modak.build.credentials`).
7. **Archive** (``oci_archive``): the image as a docker-archive tar, which ``apptainer build x.sif
   docker-archive://FILE`` turns into a SIF on a cluster.
8. **SIF** (``sif``): the image converted by Apptainer into ``OUT_DIR/<job name>.sif`` (its docker-archive, so the
   SIF has the image's layers and labels), for a site that runs Apptainer where the image was built by Podman or
   Docker.

Builds of different jobs may run at once: every temporary folder is private to its build, the engine builds
untagged images that only the finished build tags, and each build writes only into its output folder, which it
holds (:func:`out_dir_lock`) so that a second build into the same folder fails at once.

The result is a frozen :class:`BuildResult`, whose :meth:`BuildResult.to_dict` is ``modak build --json``'s
documented output (``schema_version``: :data:`modak.documents.SCHEMA_VERSION`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from modak.bench.harness import BENCH_WORKDIR
from modak.build.credentials import Credentials, find_credentials
from modak.build.engines import ApptainerEngine, BuildLog, Engine, ImageInfo, Step, make_engine, parse_self_test
from modak.documents import SCHEMA_VERSION, encoded
from modak.documents import build as doc
from modak.errors import InputError, Interrupted, PushFailed, SmokeTestFailed
from modak.image.deployment import MODEL_FILE, WORK_DIR
from modak.image.runtimes.base import reusable_artifacts
from modak.render.ir import LOCK_LABEL, BuildDescription, build_description, self_test_command
from modak.render.render import DOCKERIGNORE, render

if TYPE_CHECKING:
    from modak.plan import Plan
    from modak.spec.target import Container

ARTIFACTS_LABEL = "io.modak.tuned-artifacts"
BUILD_LOG = "build.log"
LOCK_NAME = "requirements.lock"
SMOKE_NAME = "smoke-test.json"
SIF_LOG = "sif.log"  # the conversion of the image into a SIF (--sif)
SMOKE_LOG = "smoke-test.log"  # the self-test's exit code, stdout and stderr, kept for diagnosis
OUT_DIR_LOCK = ".modak-build.lock"  # held while a build uses its output folder (see out_dir_lock)


@dataclass(frozen=True)
class BuildOptions:
    engine: str | None = None  # a registered engine's name (modak.build.engines); default: the target's
    push: bool = False
    smoke: bool = True
    oci_archive: Path | None = None
    sif: bool = False  # also convert the built image into a SIF (Apptainer)
    smoke_timeout: float = 900.0
    no_cache: bool = False  # rebuild every layer (benchmarks/tools/build_cache.py's cold build)


class Progress(Protocol):
    """What the pipeline tells its user while it works (the CLI shows a rich progress display)."""

    def phase(self, text: str) -> None:
        """A new phase (rendering, building, smoke test, ...)."""

    def step(self, step: Step) -> None:
        """The build reached a new step."""

    def line(self, text: str) -> None:
        """One line of the build log."""


class SilentProgress:
    """A :class:`Progress` that shows nothing (the API's default)."""

    def phase(self, text: str) -> None:
        return None

    def step(self, step: Step) -> None:
        return None

    def line(self, text: str) -> None:
        return None


@dataclass(frozen=True)
class BuildResult:
    """What :func:`build_job` built; ``job_id`` and ``submission`` are filled in (``dataclasses.replace``) when
    the job script was submitted too."""

    plan: Plan
    ir: BuildDescription
    out_dir: Path
    engine: Engine
    image_ref: str
    image: ImageInfo | None
    lock_digest: str | None = None
    lock_packages: int | None = None
    tuned: Mapping[str, str] = field(default_factory=dict)  # image path -> host path
    smoke: Mapping[str, Any] | None = None
    pushed_ref: str | None = None
    pushed_digest: str | None = None
    oci_archive: Path | None = None
    sif: Path | None = None
    artifacts: tuple[Path, ...] = ()
    seconds: Mapping[str, float] = field(default_factory=dict)
    job_id: str | None = None
    submission: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """``modak build --json`` (schema_version 1); documented in docs/json-output.md."""
        candidate, prediction = self.plan.choice.candidate, self.plan.choice.prediction
        image = self.image
        return encoded(doc.BuildDocument(
            schema_version=SCHEMA_VERSION, job=self.plan.loaded.job.name, target=self.plan.loaded.target.name,
            output=str(self.out_dir),
            engine=doc.Engine(name=self.engine.name, endpoint=self.engine.endpoint()),  # type: ignore[arg-type]
            image=doc.Image(ref=self.image_ref, id=image.id if image else None,
                            size_bytes=image.size if image else None, labels=dict(image.labels) if image else {}),
            choice=doc.Choice(candidate=candidate.name, runtime=candidate.runtime,
                              device=candidate.device, precision=candidate.precision.value,  # type: ignore[arg-type]
                              parameters=dict(candidate.params), chosen_by=self.plan.chosen_by),  # type: ignore[arg-type]
            predicted_step_seconds=prediction.step_seconds,
            requirements_lock=None if self.lock_digest is None else doc.Lock(
                digest=self.lock_digest, packages=self.lock_packages, file=str(self.out_dir / LOCK_NAME)),
            tuned_artifacts=dict(self.tuned), smoke_test=dict(self.smoke) if self.smoke is not None else None,
            pushed=None if self.pushed_ref is None else doc.Pushed(ref=self.pushed_ref, digest=self.pushed_digest),
            oci_archive=str(self.oci_archive) if self.oci_archive else None, sif=str(self.sif) if self.sif else None,
            artifacts=sorted(str(p) for p in self.artifacts), build_log=str(self.out_dir / BUILD_LOG),
            seconds={k: round(v, 3) for k, v in self.seconds.items()}, job_id=self.job_id,
            submission=dict(self.submission) if self.submission is not None else None))


def build_job(plan: Plan, out_dir: Path, options: BuildOptions = BuildOptions(),
              progress: Progress | None = None, engine: Engine | None = None) -> BuildResult:
    """Render, build, label, smoke-test, tag, push and archive the plan's choice (see the module docstring)."""
    progress = progress or SilentProgress()
    out_dir = Path(out_dir).absolute()
    target = plan.loaded.target
    engine = (engine or make_engine(options.engine or target.container.engine)).for_target(target.container)
    if options.push and not target.container.registry:
        raise plan.loaded.target_doc.error(("container",), "--push needs container.registry (where to push)")
    if options.sif:
        if isinstance(engine, ApptainerEngine):
            raise InputError("the image is a SIF already: --sif converts the image of a Docker or Podman build")
        ApptainerEngine().for_target(target.container).check()
    engine.check()  # before rendering: an unreachable engine changes nothing on disk
    with out_dir_lock(out_dir):
        return _build(plan, out_dir, options, progress, engine)


@contextmanager
def out_dir_lock(out_dir: Path) -> Iterator[None]:
    """Hold ``OUT_DIR/.modak-build.lock`` (an exclusive ``flock``, released when the process ends however it
    ends) while building: a second build into the same folder fails at once instead of mixing files."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("exists and is not a folder", out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / OUT_DIR_LOCK).open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            raise InputError(f"another modak build{f' (process {holder})' if holder else ''} is using this output "
                             "folder; wait for it to end or choose another --output", out_dir) from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def _build(plan: Plan, out_dir: Path, options: BuildOptions, progress: Progress, engine: Engine) -> BuildResult:
    """:func:`build_job` once it holds the output folder."""
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    progress.phase("rendering")
    ir = build_description(plan)
    pushed_ref = engine.registry_ref(ir)
    credentials = find_credentials(pushed_ref.partition("://")[2] or pushed_ref) if options.push else None
    written = render(ir, out_dir)
    for stale in (LOCK_NAME, SMOKE_NAME, SMOKE_LOG):  # a previous build's: they must describe this one
        (out_dir / stale).unlink(missing_ok=True)
    artifacts = [*written, out_dir / DOCKERIGNORE, out_dir / BUILD_LOG]
    seconds["render"] = time.perf_counter() - started

    log = BuildLog(out_dir / BUILD_LOG, on_line=progress.line, on_step=progress.step)
    try:
        try:
            progress.phase(f"building with {engine.name}")
            start = time.perf_counter()
            inputs = engine.bootstrap_files(ir, out_dir, log)
            try:
                image_id = engine.build(out_dir, log, no_cache=options.no_cache)
            finally:
                for made in inputs:
                    made.unlink(missing_ok=True)
            seconds["build"] = time.perf_counter() - start

            start = time.perf_counter()
            lock = _save_lock(engine, image_id, ir.lock_file, out_dir / LOCK_NAME, log)
            if lock:
                artifacts.append(out_dir / LOCK_NAME)
            tuned = tuned_artifacts(plan)
            labels = {LOCK_LABEL: lock[0]} if lock else {}
            if tuned:
                labels[ARTIFACTS_LABEL] = ",".join(sorted(tuned))
            if labels:
                progress.phase("labelling")
                image_id = engine.add_layer(image_id, labels, tuned, log)
            seconds["label"] = time.perf_counter() - start
        except KeyboardInterrupt:
            log.note(f"interrupted at {log.where()}")
            raise Interrupted(f"interrupted at {log.where()}; no image was tagged; full log: {log.path}") from None
        finally:
            log.close()

        smoke = None
        if options.smoke:
            progress.phase("smoke test")
            start = time.perf_counter()
            smoke = smoke_test(engine, image_id, plan, options.smoke_timeout, out_dir / SMOKE_LOG)
            progress.phase(f"smoke test: {smoke.get('message', 'ok')}")
            seconds["smoke"] = time.perf_counter() - start
            (out_dir / SMOKE_NAME).write_text(json.dumps(smoke, indent=2, sort_keys=True) + "\n")
            artifacts += [out_dir / SMOKE_LOG, out_dir / SMOKE_NAME]

        image_ref = engine.image_ref(ir, out_dir)
        engine.tag(image_id, image_ref)
        image = engine.inspect(image_ref)

        pushed_digest = None
        if options.push:
            progress.phase(f"pushing {pushed_ref}"
                           + (f" with the credentials from {credentials.source}" if credentials else ""))
            start = time.perf_counter()
            pushed_digest = push(engine, image_ref, pushed_ref, image.labels if image else {}, credentials)
            seconds["push"] = time.perf_counter() - start

        archive = None
        if options.oci_archive:
            progress.phase(f"saving {options.oci_archive}")
            start = time.perf_counter()
            archive = Path(options.oci_archive).absolute()
            engine.save(image_ref, archive)
            artifacts.append(archive)
            seconds["archive"] = time.perf_counter() - start

        sif = None
        if options.sif:
            progress.phase(f"converting {image_ref} to a SIF with Apptainer")
            start = time.perf_counter()
            sif = out_dir / ir.job.sif
            convert_to_sif(engine, image_ref, sif, out_dir / SIF_LOG, plan.loaded.target.container)
            artifacts += [sif, out_dir / SIF_LOG]
            seconds["sif"] = time.perf_counter() - start
    except KeyboardInterrupt:
        raise Interrupted("interrupted after the build; the image is built but may be untagged") from None
    seconds["total"] = time.perf_counter() - started
    return BuildResult(
        plan, ir, out_dir, engine, image_ref, image, lock_digest=lock[0] if lock else None,
        lock_packages=lock[1] if lock else None, tuned={dest: str(src) for dest, src in tuned.items()},
        smoke=smoke, pushed_ref=pushed_ref if options.push else None, pushed_digest=pushed_digest,
        oci_archive=archive, sif=sif, artifacts=tuple(artifacts), seconds=seconds)


def convert_to_sif(engine: Engine, ref: str, sif: Path, log_path: Path, container: Container) -> None:
    """The image ``ref`` of ``engine`` as the SIF file ``sif``: saved as a docker-archive beside it, built into a
    SIF by Apptainer (the image's layers and labels; compressed as the target's ``container`` section says), the
    archive removed; the conversion's log in ``log_path``."""
    archive = sif.with_name(f".{sif.stem}.docker-archive.tar")
    log = BuildLog(log_path)
    try:
        engine.save(ref, archive)
        ApptainerEngine().for_target(container).build_from_archive(archive, sif, log)
    finally:
        log.close()
        archive.unlink(missing_ok=True)


def _save_lock(engine: Engine, image: str, lock_file: str, path: Path, log: BuildLog) -> tuple[str, int] | None:
    """Read the lock of what pip resolved (``lock_file`` in the image) back into ``path``; its digest
    (``sha256:...``) and number of packages, or None (and a note in ``log``) when the image has none."""
    lock = engine.read_file(image, lock_file)
    if lock is None:
        log.note(f"the image has no {lock_file}; no {LOCK_LABEL} label")
        return None
    path.write_bytes(lock)
    packages = sum(1 for line in lock.decode("utf-8", "replace").splitlines()
                   if line.strip() and not line.startswith("#"))
    return "sha256:" + hashlib.sha256(lock).hexdigest(), packages


def tuned_artifacts(plan: Plan, bench_workdir: Path = BENCH_WORKDIR) -> dict[str, Path]:
    """Results of ``modak bench`` that the chosen runtime reuses, as image path -> host path.

    ``modak bench`` runs each runtime in ``<bench_workdir>/<runtime>``; the runtime module names what it left
    there for this model and batch (its ``artifacts``, see :mod:`modak.image.runtimes.base`; TVM's tuning
    databases, for one). In the image they go under the image's work folder (its MODAK_WORKDIR), named as the
    image's runner looks them up, so that its prepare reuses them instead of starting again.
    """
    runtime, source = plan.choice.candidate.runtime, plan.source
    workdir = bench_workdir / runtime
    model_stem = source.zoo or (Path(source.onnx_path).stem if source.onnx_path else source.name)
    found = reusable_artifacts(runtime, workdir, model_stem, plan.workload.batch_size,
                               source.zoo or Path(MODEL_FILE).stem)
    return {f"{WORK_DIR}/{relative}": path for relative, path in found.items()}


def smoke_test(engine: Engine, image: str, plan: Plan, timeout: float = 900.0,
               log: Path | None = None) -> dict[str, Any]:
    """Run the image's entrypoint with the self-test; its JSON, checked against the plan's choice.

    ``log`` gets the run's exit code, stdout and stderr (whatever the outcome)."""
    candidate = plan.choice.candidate
    gpus = plan.ceilings.gpu_count if candidate.device == "gpu" else 0
    command = self_test_command(plan.loaded.job.task.value)
    outcome = engine.run(image, command, timeout=timeout, gpus=gpus)
    if log is not None:
        log.write_text(f"# modak: {' '.join(command)} in image {image}: exit {outcome.exit_code}"
                       f"{' (timed out)' if outcome.timed_out else ''}\n# stdout\n{outcome.stdout}"
                       f"\n# stderr\n{outcome.stderr}")
    where = f"image {image}" + (f" (output in {log})" if log is not None else "")
    report = parse_self_test(outcome.stdout)
    stderr = " | ".join(line for line in outcome.stderr.strip().splitlines()[-5:] if line.strip())
    if outcome.timed_out:
        raise SmokeTestFailed(f"smoke test of {where} did not finish within {timeout:g} s")
    if report is None:
        raise SmokeTestFailed(f"smoke test of {where} exited with {outcome.exit_code} and printed no JSON"
                              + (f": {stderr[-600:]}" if stderr else ""))
    if outcome.exit_code != 0 or report.get("status") != "ok":
        raise SmokeTestFailed(f"smoke test of {where} failed (exit {outcome.exit_code}): "
                              f"{str(report.get('error', report))[:600]}")
    if report.get("runtime") != candidate.runtime:
        raise SmokeTestFailed(f"smoke test of {where} ran runtime {report.get('runtime')!r}, but the plan chose "
                              f"{candidate.runtime!r}")
    if report.get("device", candidate.device) != candidate.device:
        raise SmokeTestFailed(f"smoke test of {where} ran on {report.get('device')!r}, but the plan chose "
                              f"{candidate.device!r}")
    return report


def push(engine: Engine, image: str, ref: str, labels: Mapping[str, str],
         credentials: Credentials | None = None) -> str | None:
    """Push the tagged ``image`` to ``ref``, pull it back and check that the registry's copy has the same
    ``labels``; the registry's manifest digest, where the engine reports one. ``credentials``: the registry login,
    for both."""
    digest = engine.push(image, ref, credentials=credentials)
    pulled = engine.pull(ref, credentials)
    expected = dict(labels)
    differing = sorted(k for k in set(expected) | set(pulled.labels) if expected.get(k) != pulled.labels.get(k))
    if differing:
        raise PushFailed(f"pulled {ref} back, but its labels differ: {', '.join(differing)}")
    if digest is None:
        digest = next((d.rpartition("@")[2] for d in pulled.repo_digests if d.startswith(ref.rpartition(":")[0])),
                      None)
    return digest
