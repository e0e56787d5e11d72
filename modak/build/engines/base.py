"""The container engine interface, what a build streams its log into, and the registry of engines.

An engine is one module beside this one: a subclass of :class:`Engine` registered under the names it serves
(``@ENGINES.register("docker", "podman")``; a target's ``container.engine``, whose names live in
:mod:`modak.spec.names`), constructed with the name it was asked for.

Builds stream their log line by line into a :class:`BuildLog` (a file plus callbacks for progress), never
waiting for the whole build. A build produces an *untagged* image; the caller tags it only once everything it
checks has passed, so a failed or interrupted build never leaves a tag behind (Podman may finish a build whose
client went away, but nothing names the result).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from modak.build.credentials import Credentials
from modak.errors import BuildFailed, ModakError, PushFailed
from modak.registry import Registry

if TYPE_CHECKING:
    from modak.render.ir import BuildDescription
    from modak.spec.target import Container

_STEP = re.compile(r"^(?:STEP|Step) (\d+)/(\d+) ?: ?(.*)$")


@dataclass(frozen=True)
class Step:
    number: int
    total: int
    instruction: str

    def __str__(self) -> str:
        return f"step {self.number}/{self.total} ({shorten(self.instruction, 120)})"


class BuildLog:
    """The full log of one build: appended to ``path`` as it arrives, the current step tracked.

    ``on_line`` sees every line, ``on_step`` every new step (number, total, instruction).
    """

    def __init__(self, path: Path | None = None, on_line: Callable[[str], None] | None = None,
                 on_step: Callable[[Step], None] | None = None) -> None:
        self.path = path
        self.on_line = on_line
        self.on_step = on_step
        self.step: Step | None = None
        self.steps: list[Step] = []
        self.tail: deque[str] = deque(maxlen=40)
        self._partial = ""
        self._file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", encoding="utf-8")

    def write(self, text: str) -> None:
        if self._file:
            self._file.write(text)
            self._file.flush()
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._line(line)

    def note(self, text: str) -> None:
        """A line of modak's own (``# modak: ...``)."""
        self.write(f"# modak: {text}\n")

    def _line(self, line: str) -> None:
        line = line.rstrip("\r")
        self.tail.append(line)
        match = _STEP.match(line)
        if match:
            self.step = Step(int(match[1]), int(match[2]), match[3].strip())
            self.steps.append(self.step)
            if self.on_step:
                self.on_step(self.step)
        if self.on_line:
            self.on_line(line)

    def close(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""
        if self._file:
            self._file.close()
            self._file = None

    def where(self) -> str:
        return str(self.step) if self.step else "before the first step"

    def failure(self, reason: str) -> BuildFailed:
        """A :class:`BuildFailed` naming the current step, the reason and the log file."""
        log = f"; full log: {self.path}" if self.path else ""
        at = f" at {self.step}" if self.step else ""  # an engine whose log has no steps (Apptainer) says none
        return BuildFailed(f"build failed{at}: {shorten(reason, 400)}{log}",
                           step=str(self.step) if self.step else None, log=self.path)


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    size: int | None = None
    repo_digests: tuple[str, ...] = ()


class Engine(ABC):
    """A container engine: build a context into an image, run it, and move it between places.

    The interface speaks of images and runs, not of any engine's options: each engine translates them (its own
    definition file in the rendered context, GPUs, network, where its images live).
    """

    name: str  # the name it was made under (:func:`make_engine`)

    @abstractmethod
    def check(self) -> None:
        """Raise :class:`EngineUnavailable` (one line, with how to start one) when the engine cannot be used."""

    @abstractmethod
    def endpoint(self) -> str:
        """Where the engine is (a socket URL or a binary), for messages and reports."""

    @abstractmethod
    def build(self, context: Path, log: BuildLog, no_cache: bool = False) -> str:
        """Build the engine's definition file in ``context`` and return the new image's id (untagged); failures
        raise :class:`BuildFailed`. ``no_cache``: rebuild what the engine would take from its cache."""

    def for_target(self, container: Container) -> Engine:
        """This engine as the target's ``container`` section configures it (Apptainer: how SIF files are
        compressed). Default: itself."""
        return self

    def bootstrap_files(self, ir: BuildDescription, context: Path, log: BuildLog) -> list[Path]:
        """Make what this engine's build reads from ``context`` beyond the rendered files (Apptainer: the local base
        image's docker-archive); the files made, which the pipeline removes after the build. Default: none."""
        return []

    def image_ref(self, ir: BuildDescription, out_dir: Path) -> str:
        """The name a finished build gets (:meth:`tag`): the plan's image reference."""
        return ir.image.ref

    @abstractmethod
    def tag(self, image: str, ref: str) -> None:
        """Name ``image`` ``ref``."""

    @abstractmethod
    def inspect(self, ref: str) -> ImageInfo | None:
        """The image, or None when there is none by that name."""

    @abstractmethod
    def run(self, image: str, command: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 600, gpus: int = 0, network: bool = False) -> RunResult:
        """Run ``image`` (its entrypoint, with ``command`` instead of its default one) and wait for it.

        ``env``: extra environment variables; ``timeout``: seconds before the run is killed (exit code 124,
        ``timed_out``); ``gpus``: how many GPUs the run uses (0: none; otherwise the host's GPUs are made
        available); ``network``: whether the run may reach the network, where the engine can cut it off.
        """

    @abstractmethod
    def read_file(self, image: str, path: str) -> bytes | None:
        """A file's content from the image, or None when the image has no such file."""

    @abstractmethod
    def add_layer(self, image: str, labels: Mapping[str, str], files: Mapping[str, Path], log: BuildLog) -> str:
        """``image`` with extra labels and files (image path -> host path) on top; the new image's id, or
        ``image`` itself for an engine whose images cannot change after their build (it says so in ``log``)."""

    def registry_ref(self, ir: BuildDescription) -> str:
        """Where ``--push`` puts the image: the plan's image reference (an engine whose images are files says how
        its registry names them)."""
        return ir.image.ref

    def push(self, image: str, ref: str, log: BuildLog | None = None,
             credentials: Credentials | None = None) -> str | None:
        """Push the tagged ``image`` to ``ref`` (:meth:`registry_ref`; the same name where images are named by
        it), logging in with ``credentials``, if any; the manifest digest when the engine reports it. Nothing it
        logs or raises contains the password."""
        raise PushFailed(f"the {self.name} engine cannot push images")

    def pull(self, ref: str, credentials: Credentials | None = None) -> ImageInfo:
        """Pull ``ref`` from its registry (logging in with ``credentials``, if any)."""
        raise PushFailed(f"the {self.name} engine cannot pull images")

    def save(self, ref: str, path: Path) -> None:
        """Write ``ref`` as a docker-archive tar file (what ``apptainer build x.sif docker-archive://`` reads)."""
        raise ModakError(f"the {self.name} engine cannot save images as archives")

    def remove(self, ref: str) -> None:
        """Remove the name ``ref`` (and the image when nothing else names it); nothing when absent. An engine
        whose builds leave no named image (Apptainer writes a file) has nothing to remove."""
        return None


ENGINES: Registry[Callable[[str], Engine]] = Registry("container engine")


def make_engine(name: str) -> Engine:
    """The engine called ``name`` (a registered one: docker, podman or apptainer)."""
    return ENGINES.get(name)(name)


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

