"""Apptainer (or SingularityCE) through its command line, unprivileged (``--fakeroot``), with ``--nv`` for GPUs."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from modak.build.credentials import PASSWORD_ENV, USERNAME_ENV, Credentials
from modak.build.engines.base import ENGINES, BuildLog, Engine, ImageInfo, RunResult, shorten
from modak.errors import EngineUnavailable, PushFailed
from modak.render.ir import MKSQUASHFS_ARGS

if TYPE_CHECKING:
    from modak.render.ir import BuildDescription
    from modak.spec.target import Container

ORAS = "oras://"  # a SIF file as an OCI artifact in a registry
REGISTRY_TIMEOUT_S = 1800
START_HINT = ("install Apptainer (https://apptainer.org/docs/admin/main/installation.html), or build with --engine "
              "podman and convert: `modak build --oci-archive image.tar` then "
              "`apptainer build image.sif docker-archive://image.tar`")


@ENGINES.register("apptainer")
class ApptainerEngine(Engine):
    """Apptainer (or SingularityCE) through its command line, unprivileged: ``build --fakeroot``, ``--nv``.

    Images are SIF files; "tagging" moves a finished build from its temporary name to the final one.
    """

    def __init__(self, name: str = "apptainer", binary: str | None = None, mksquashfs_args: str | None = None) -> None:
        self.name = name
        self.binary = binary or shutil.which("apptainer") or shutil.which("singularity")
        self.mksquashfs_args = mksquashfs_args

    def for_target(self, container: Container) -> ApptainerEngine:
        """This Apptainer, building SIF files compressed as the target's ``container.sif_compression`` says."""
        return ApptainerEngine(self.name, self.binary, MKSQUASHFS_ARGS[container.sif_compression])

    def endpoint(self) -> str:
        return self.binary or "apptainer (not found)"

    def check(self) -> None:
        if not self.binary:
            raise EngineUnavailable(f"neither apptainer nor singularity is on PATH; {START_HINT}")
        if self.mksquashfs_args is not None and not self._takes_mksquashfs_args:
            raise EngineUnavailable(f"the target's container.sif_compression asks mksquashfs for "
                                    f"{self.mksquashfs_args!r}, and {self.binary} has no `build --mksquashfs-args` "
                                    "(Apptainer 1.4 or later has it): install Apptainer 1.4 or later, or set "
                                    "container.sif_compression: gzip")

    def _stream(self, argv: Sequence[str], log: BuildLog, cwd: Path | None = None) -> int:
        log.note("$ " + shlex.join(argv))
        process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   errors="replace", stdin=subprocess.DEVNULL)
        try:
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
            return process.wait()
        except BaseException:
            process.terminate()
            process.wait()
            raise

    def bootstrap_files(self, ir: BuildDescription, context: Path, log: BuildLog) -> list[Path]:
        """The local base image as the docker-archive the definition file bootstraps from, saved by Podman or
        Docker (``podman save``): no registry serves a ``localhost/`` image."""
        if ir.base.archive is None:
            return []
        saver = shutil.which("podman") or shutil.which("docker")
        archive = context / ir.base.archive
        how = f"save it there (`podman save --format docker-archive -o {archive} {ir.base.ref}`)"
        if saver is None:
            raise log.failure(f"the definition file bootstraps from the local image {ir.base.ref} as {archive}, and "
                              f"neither podman nor docker is here to save it: {how}, or map container.base_images "
                              "to an image of a registry")
        code = self._stream([saver, "save", "--format", "docker-archive", "-o", str(archive), ir.base.ref]
                            if Path(saver).name == "podman" else [saver, "save", "-o", str(archive), ir.base.ref], log)
        if code != 0:
            archive.unlink(missing_ok=True)
            raise log.failure(f"{Path(saver).name} save {ir.base.ref} exited with {code}: {how}")
        return [archive]

    def build(self, context: Path, log: BuildLog, no_cache: bool = False) -> str:
        """Build ``context/Singularity.def`` into a SIF file beside it (its path is the image's id), without its
        ``%test`` (the pipeline's smoke test runs the same command next; ``apptainer test`` runs it later). A SIF
        build has no layer cache: ``no_cache`` changes nothing. A failed or interrupted build leaves no file."""
        return self._build_sif(context, "Singularity.def", log)

    def build_from_archive(self, archive: Path, sif: Path, log: BuildLog) -> None:
        """A SIF from a docker-archive tar (``modak build --oci-archive`` on a machine with Podman or Docker)."""
        self._build_sif(sif.parent, f"docker-archive://{archive.absolute()}", log, sif)

    def _build_sif(self, folder: Path, source: str, log: BuildLog, final: Path | None = None) -> str:
        """Build ``source`` (relative to ``folder``, where the build runs) into a temporary SIF in ``folder``
        (renamed to ``final`` where given); its path."""
        self.check()
        assert self.binary
        handle, partial = tempfile.mkstemp(prefix=".build.", suffix=".sif", dir=folder)
        os.close(handle)
        unprivileged = ["--fakeroot"] if os.geteuid() != 0 else []  # root builds as root
        squash = ["--mksquashfs-args", self.mksquashfs_args] if self.mksquashfs_args is not None else []
        try:
            code = self._stream([self.binary, "build", *unprivileged, *squash, "--notest", "--force", partial, source],
                                log, cwd=folder)
            if code != 0:
                raise log.failure(f"{Path(self.binary).name} build exited with {code}")
            if final is not None:
                Path(partial).replace(final)
                return str(final)
            return partial
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise

    @cached_property
    def _takes_mksquashfs_args(self) -> bool:
        """Whether this Apptainer's ``build`` has ``--mksquashfs-args`` (Apptainer 1.4 or later)."""
        assert self.binary
        usage = subprocess.run([self.binary, "build", "--help"], capture_output=True, text=True, errors="replace",
                               stdin=subprocess.DEVNULL, timeout=60)
        return "--mksquashfs-args" in usage.stdout + usage.stderr

    def image_ref(self, ir: BuildDescription, out_dir: Path) -> str:
        """The SIF file the job script runs."""
        return str(out_dir / ir.job.sif)

    def add_layer(self, image: str, labels: Mapping[str, str], files: Mapping[str, Path], log: BuildLog) -> str:
        """``image`` unchanged: a SIF's labels and files come from its definition file alone (its ``%post`` labels
        the requirements lock); the log names what the SIF lacks of ``labels`` and ``files``."""
        info = self.inspect(image)
        lacking = sorted(k for k, v in labels.items() if (info.labels if info else {}).get(k) != v)
        if lacking or files:
            log.note("a SIF file cannot change after its build: it lacks "
                     + "; ".join(part for part in (f"the labels {', '.join(lacking)}" if lacking else "",
                                                   f"the files {', '.join(sorted(files))}" if files else "") if part))
        return image

    def tag(self, image: str, ref: str) -> None:
        Path(image).replace(ref)

    def inspect(self, ref: str) -> ImageInfo | None:
        if not Path(ref).is_file():
            return None
        self.check()
        assert self.binary
        result = subprocess.run([self.binary, "inspect", "--json", "--labels", ref], capture_output=True, text=True)
        labels: dict[str, str] = {}
        if result.returncode == 0:
            try:
                data = json.loads(result.stdout)
                labels = data.get("data", {}).get("attributes", {}).get("labels", {}) or {}
            except json.JSONDecodeError:
                pass
        return ImageInfo(id=str(Path(ref).resolve()), tags=(ref,), labels=labels, size=Path(ref).stat().st_size)

    def run(self, image: str, command: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 600, gpus: int = 0, network: bool = False) -> RunResult:
        """``apptainer run --containall``, with ``--nv`` for GPUs. The run shares the host's network either way:
        an unprivileged Apptainer cannot rely on network namespaces, which many sites disable."""
        self.check()
        assert self.binary
        argv = [self.binary, "run", "--containall", *(["--nv"] if gpus else [])]
        for key, value in (env or {}).items():
            argv += ["--env", f"{key}={value}"]
        argv += [image, *(command or ())]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout,
                                    stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            return RunResult(124, _text(exc.stdout), _text(exc.stderr), True)
        return RunResult(result.returncode, result.stdout, result.stderr)

    def read_file(self, image: str, path: str) -> bytes | None:
        self.check()
        assert self.binary
        result = subprocess.run([self.binary, "exec", image, "cat", path], capture_output=True)
        return result.stdout if result.returncode == 0 else None

    def registry_ref(self, ir: BuildDescription) -> str:
        """The plan's image reference as an OCI artifact (ORAS), as ``apptainer push`` and ``pull`` name it."""
        return ORAS + ir.image.ref

    def push(self, image: str, ref: str, log: BuildLog | None = None,
             credentials: Credentials | None = None) -> str | None:
        """``apptainer push SIF oras://...`` (the login as Apptainer's environment variables, never arguments);
        no digest (Apptainer does not print one)."""
        self._registry("push", [image, ref], ref, credentials, log)
        return None

    def pull(self, ref: str, credentials: Credentials | None = None) -> ImageInfo:
        """``apptainer pull`` of ``ref`` into a temporary file, whose labels are read."""
        with tempfile.TemporaryDirectory(prefix="modak-pull-") as folder:
            pulled = Path(folder) / "pulled.sif"
            self._registry("pull", ["--force", str(pulled), ref], ref, credentials)
            info = self.inspect(str(pulled))
        if info is None:
            raise PushFailed(f"pulling {ref} gave no SIF file")
        return ImageInfo(id=ref, tags=(ref,), labels=info.labels, size=info.size)

    def _registry(self, verb: str, args: Sequence[str], ref: str, credentials: Credentials | None,
                  log: BuildLog | None = None) -> None:
        self.check()
        assert self.binary
        env = {**os.environ, **({"APPTAINER_DOCKER_USERNAME": credentials.username,
                                 "APPTAINER_DOCKER_PASSWORD": credentials.password} if credentials else {})}
        redact = credentials.redact if credentials else str
        try:
            result = subprocess.run([self.binary, verb, *args], capture_output=True, text=True, errors="replace",
                                    env=env, stdin=subprocess.DEVNULL, timeout=REGISTRY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PushFailed(f"{verb}ing {ref} did not finish within {REGISTRY_TIMEOUT_S} s") from None
        output = redact(result.stdout + result.stderr)
        if log is not None:
            log.write(output)
        if result.returncode != 0:
            reason = " | ".join(line.strip() for line in output.strip().splitlines()[-3:])
            raise PushFailed(f"{verb}ing {ref} failed: {shorten(reason, 400)}"
                             + ("" if credentials else f"; a registry that requires a login takes "
                                f"{USERNAME_ENV} and {PASSWORD_ENV}"))

    def remove(self, ref: str) -> None:
        Path(ref).unlink(missing_ok=True)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

