"""``modak run --input PATH --output DIR``: batch inference over NumPy files with the image's model, resumable.

Input (PATH)
    A folder: every ``.npy``/``.npz`` file directly in it (subfolders are not searched, hidden files are ignored) is
    one item, in name order. Or one such file: one item. A ``.npy`` file holds the model's only input; an ``.npz``
    archive holds one array per input, named by the model's input names. An item's arrays have a leading sample
    dimension (N samples, the same N for every input); arrays of exactly the per-sample shape are one sample. A file
    is the unit of resumption and of memory, so a large data set is best a folder of files rather than one archive.
    Files are read with ``allow_pickle=False``: arrays of Python objects are refused, as are files larger than
    ``--max-file-mb`` (an archive: its arrays uncompressed).

Output (DIR, created if missing; not the input folder)
    ``DIR/<file stem>.npz`` per item: the model's outputs by name, sample for sample (``--format npy``:
    ``DIR/<stem>.npy``, single-output models only). An item given without a sample dimension gets outputs without
    one. Each output is written to a hidden temporary file in DIR and renamed, so it is complete or absent; outputs
    already present are skipped, so running the same command again resumes an interrupted run.

Batching
    Items are read in a thread, two ahead of the model, and their samples queued across item boundaries: every step
    runs ``model.capacity`` samples (the batch size the plan tuned) and only the run's last step is padded.

Exit codes
    0 every item done or skipped; 2 bad arguments, or a bad input file (named; the run stops after writing the items
    already read); 3 the model failed or could not be loaded, or an output could not be written; 4 with
    ``--keep-going``: some input files were bad (named, the others done); 130 interrupted (SIGINT or SIGTERM): the
    outputs written so far are complete, none is partial; run again to resume.

A progress bar (samples) and one summary line go to stderr; ``--json`` also prints the summary as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import time
import zipfile
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from modak.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_RUN_FAILED, EXIT_SOME_INPUTS_BAD

if TYPE_CHECKING:
    from modak.runtime import Model, TensorSpec

SUFFIXES = (".npy", ".npz")
READ_AHEAD = 2  # items read ahead of the model (each at most --max-file-mb)
EPILOG = """\
input: a folder of .npy/.npz files (not searched recursively) or one such file; a .npy file holds the model's only
input, an .npz archive one array per input named by the input names; a leading sample dimension is optional.
output: DIR/<file stem>.npz (or .npy) per input file, written atomically; existing outputs are skipped (resume).

exit codes: 0 done; 2 bad arguments or a bad input file (stops); 3 the model failed or an output could not be
written; 4 some input files were bad (--keep-going); 130 interrupted (SIGINT/SIGTERM; run again to resume)."""


class UsageError(Exception):
    """Arguments that cannot run: a missing input, no input files, an output that is not a writable folder."""


class BadInput(Exception):
    """An input file that cannot be used (the caller names the file)."""


class Failed(Exception):
    """The model failed, or an output could not be written: the run stops."""


@dataclass(frozen=True)
class Item:
    """One input file; its outputs go to ``name`` plus the format's suffix in the output folder."""

    path: Path
    name: str


@dataclass
class Summary:
    """What a run did: counts, failures (file and message), samples and seconds."""

    status: str = "ok"  # ok | failed (bad files skipped) | stopped (at a bad file) | interrupted | error
    items: int = 0
    done: int = 0
    skipped: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)
    samples: int = 0
    seconds: float = 0.0
    output: str = ""
    error: str | None = None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        return (f"modak run: {self.done} done, {self.skipped} skipped, {len(self.failures)} failed of {self.items} "
                f"items; {self.samples} samples in {self.seconds:.1f} s ({self.samples_per_s:.1f} samples/s)"
                + ("" if self.status == "ok" else f"; {self.status}"))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failed": len(self.failures), "samples_per_s": round(self.samples_per_s, 3)}


def configure(parser: argparse.ArgumentParser) -> None:
    """The ``modak run`` arguments on ``parser`` (a subcommand's parser)."""
    parser.description = "Batch inference with this image's model over .npy/.npz files; resumable."
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--input", required=True, type=Path, metavar="PATH",
                        help="a folder of .npy/.npz files, or one such file")
    parser.add_argument("--output", required=True, type=Path, metavar="DIR",
                        help="folder for the outputs (created if missing)")
    parser.add_argument("--format", choices=("npz", "npy"), default="npz",
                        help="npz: outputs by name (default); npy: the only output of a single-output model")
    parser.add_argument("--keep-going", action="store_true",
                        help="record bad input files and go on (exit 4 at the end) instead of stopping (exit 2)")
    parser.add_argument("--max-file-mb", type=float, default=1024.0, metavar="MB",
                        help="refuse input files larger than this (default 1024)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="also print the summary as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    """Run ``modak run``; the exit code (see the module's docstring)."""
    summary = Summary(output=str(args.output))
    stop = _StopRequest()
    with stop:
        try:
            code = _run(args, summary, stop)
        except UsageError as exc:
            summary.status, summary.error, code = "error", str(exc), EXIT_BAD_INPUT
        except Failed as exc:
            summary.status, summary.error, code = "error", str(exc), EXIT_RUN_FAILED
        except KeyboardInterrupt:
            summary.status, code = "interrupted", EXIT_INTERRUPTED
    if summary.error:
        print(f"modak run: {summary.error}", file=sys.stderr)
    if summary.items:
        print(summary.line(), file=sys.stderr)
    if args.json:
        print(json.dumps(summary.to_dict(), sort_keys=True), flush=True)
    return code


def _run(args: argparse.Namespace, summary: Summary, stop: _StopRequest) -> int:
    if not args.max_file_mb > 0:
        raise UsageError(f"--max-file-mb must be positive, not {args.max_file_mb:g}")
    items = find_items(args.input)
    summary.items = len(items)
    prepare_output(args.output, args.input if args.input.is_dir() else args.input.parent)
    suffix = f".{args.format}"
    todo = [item for item in items if not (args.output / f"{item.name}{suffix}").exists()]
    summary.skipped = len(items) - len(todo)
    if not todo:
        return EXIT_OK

    import modak.runtime

    try:
        model = modak.runtime.load()
    except Exception as exc:
        raise Failed(f"cannot load the model: {type(exc).__name__}: {exc}") from None
    stop.soft = True
    if args.format == "npy" and len(model.outputs) != 1:
        raise UsageError(f"--format npy needs a single-output model; this one has {len(model.outputs)} outputs "
                         f"({', '.join(o.name for o in model.outputs)}): use --format npz")

    from tqdm import tqdm

    hints = {item: _samples_hint(item.path, model.inputs) for item in todo}
    bar = tqdm(total=sum(hints.values()), unit="sample", disable=args.quiet, file=sys.stderr, dynamic_ncols=True,
               mininterval=0.2 if sys.stderr.isatty() else 5.0)
    max_bytes = int(args.max_file_mb * 2**20)

    def done(item: Item, outputs: dict[str, np.ndarray], samples: int) -> None:
        write_outputs(args.output / f"{item.name}{suffix}", outputs, npy=args.format == "npy")
        summary.done += 1
        summary.samples += samples

    batcher = ItemBatcher(model, done, bar.update)
    start = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modak-read")
    try:
        for item, read in _read_ahead(pool, todo, lambda path: read_item(path, model, max_bytes)):
            if stop.requested:
                break
            try:
                arrays, batched = read.result()
            except BadInput as exc:
                message = f"{item.path}: {exc}"
                summary.failures.append({"file": str(item.path), "error": str(exc)})
                if not args.quiet:
                    bar.total = (bar.total or 0) - hints[item]
                    bar.refresh()
                tqdm.write(f"modak run: {message}", file=sys.stderr)
                if args.keep_going:
                    continue
                summary.status = "stopped"
                batcher.flush()
                return EXIT_BAD_INPUT
            batcher.add(item, arrays, batched, stop)
        if not stop.requested:
            batcher.flush()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        summary.seconds = time.perf_counter() - start
        bar.close()
    if stop.requested:
        summary.status = "interrupted"
        return EXIT_INTERRUPTED
    if summary.failures:
        summary.status = "failed"
        return EXIT_SOME_INPUTS_BAD
    return EXIT_OK


def find_items(source: Path) -> list[Item]:
    """The input files of ``source`` (a folder, not searched recursively, or one file) in name order."""
    if not source.exists():
        raise UsageError(f"{source}: no such file or folder")
    if source.is_dir():
        try:
            paths = sorted(p for p in source.iterdir()
                           if p.suffix.lower() in SUFFIXES and not p.name.startswith(".") and p.is_file())
        except OSError as exc:
            raise UsageError(f"{source}: cannot list the folder: {exc.strerror}") from None
        if not paths:
            raise UsageError(f"{source}: no .npy or .npz files in this folder (subfolders are not searched)")
    elif source.suffix.lower() in SUFFIXES:
        paths = [source]
    else:
        raise UsageError(f"{source}: not a .npy or .npz file, nor a folder of them")
    items: dict[str, Item] = {}
    for path in paths:
        if path.stem in items:
            raise UsageError(f"{items[path.stem].path.name} and {path.name} in {source} would write the same "
                             f"output {path.stem}: rename one")
        items[path.stem] = Item(path, path.stem)
    return list(items.values())


def prepare_output(folder: Path, inputs_folder: Path) -> None:
    """Create the output folder if missing; :class:`UsageError` unless it is a writable folder apart from the
    inputs."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{folder}: exists and is not a folder") from None
    except OSError as exc:
        raise UsageError(f"{folder}: cannot create the output folder: {exc.strerror}") from None
    if folder.resolve() == inputs_folder.resolve():
        raise UsageError(f"{folder}: the output folder must not be the folder of the inputs")
    probe = folder / f".modak-probe-{secrets.token_hex(4)}"
    try:
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{folder}: the output folder is not writable: {exc.strerror}") from None


def read_item(path: Path, model: Model, max_bytes: int) -> tuple[dict[str, np.ndarray], bool]:
    """The arrays of one input file by input name, checked against the model (each with a leading sample dimension,
    in the model's dtypes), and whether the file had that dimension; :class:`BadInput` says what is wrong."""
    from modak.runtime import FeedError

    names = ", ".join(spec.name for spec in model.inputs)
    try:
        if path.stat().st_size > max_bytes:
            raise BadInput(f"larger than --max-file-mb ({path.stat().st_size / 2**20:.1f} MB)")
        with open(path, "rb") as handle:
            if not handle.read(6).startswith((b"\x93NUMPY", b"PK")):
                raise BadInput("not a NumPy .npy or .npz file (pickled data is refused)")
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            if len(model.inputs) != 1:
                raise BadInput(f"holds one array but the model has {len(model.inputs)} inputs ({names}): use an "
                               f".npz archive with arrays named {names}")
            arrays = {model.inputs[0].name: loaded}
        else:
            with loaded:
                size = sum(info.file_size for info in loaded.zip.infolist())
                if size > max_bytes:
                    raise BadInput(f"its arrays are larger than --max-file-mb ({size / 2**20:.1f} MB uncompressed)")
                arrays = {name: loaded[name] for name in loaded.files}
    except BadInput:
        raise
    except ValueError as exc:
        if "Object arrays" in str(exc):
            raise BadInput("holds Python objects (pickled), which are refused: only plain numeric arrays are read"
                           ) from None
        raise BadInput(f"cannot read it as NumPy data: {exc}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise BadInput(f"cannot read it: {type(exc).__name__}: {exc}") from None
    specs = {spec.name: spec for spec in model.inputs}
    batched = not all(np.ndim(a) == len(specs[n].shape) for n, a in arrays.items() if n in specs)
    if not batched:
        arrays = {name: np.asarray(a)[np.newaxis] if name in specs else a for name, a in arrays.items()}
    try:
        return model.check(arrays), batched
    except FeedError as exc:
        raise BadInput(str(exc)) from None


def write_outputs(path: Path, outputs: Mapping[str, np.ndarray], npy: bool = False) -> None:
    """``outputs`` as ``path`` (an .npz archive by name, or with ``npy`` the only array as .npy), written to a
    hidden temporary file beside it and renamed: the file is complete or absent."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "xb") as handle:
            if npy:
                np.lib.format.write_array(handle, np.asarray(next(iter(outputs.values()))), allow_pickle=False)
            else:  # what np.savez writes, without its keyword names (an output may be called "file")
                with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
                    for name, array in outputs.items():
                        with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                            np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise Failed(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


class ItemBatcher:
    """Queues the samples of items and runs the model on ``capacity`` samples at a time, across items; hands each
    item's outputs to ``done`` once all its samples ran."""

    def __init__(self, model: Model, done: Callable[[Item, dict[str, np.ndarray], int], None],
                 progress: Callable[[int], object]) -> None:
        self.model, self.done, self.progress = model, done, progress
        self.pending: deque[_Pending] = deque()
        self.queued = 0  # samples read but not run yet
        self.shapes: tuple[tuple[int, ...], ...] | None = None  # per-sample shapes of the pending items

    def add(self, item: Item, arrays: dict[str, np.ndarray], batched: bool, stop: _StopRequest) -> None:
        """Queue an item (checked arrays) and run every full step it makes possible (until ``stop``)."""
        shapes = tuple(a.shape[1:] for a in arrays.values())
        if self.pending and shapes != self.shapes:  # open dimensions differ: these cannot share a step
            self.flush()
        self.shapes = shapes
        samples = len(next(iter(arrays.values())))
        self.pending.append(_Pending(item, arrays, batched, samples))
        self.queued += samples
        while self.queued >= self.model.capacity and not stop.requested:
            self._step(self.model.capacity)

    def flush(self) -> None:
        """Run what is queued (the last step padded by the model)."""
        while self.queued:
            self._step(min(self.queued, self.model.capacity))

    def _step(self, take: int) -> None:
        chunks: list[dict[str, np.ndarray]] = []
        shares: list[tuple[_Pending, int]] = []
        need = take
        for pending in self.pending:
            count = min(need, pending.samples - pending.consumed)
            if count:
                chunks.append({k: a[pending.consumed:pending.consumed + count] for k, a in pending.arrays.items()})
                shares.append((pending, count))
                pending.consumed += count
                need -= count
            if not need:
                break
        feeds = {k: np.concatenate([c[k] for c in chunks]) if len(chunks) > 1 else chunks[0][k] for k in chunks[0]}
        try:
            outputs = self.model.run(feeds)
        except Exception as exc:
            names = ", ".join(str(p.item.path) for p, _ in shares)
            raise Failed(f"the model failed on samples of {names}: {type(exc).__name__}: {exc}") from None
        offset = 0
        for pending, count in shares:  # copies: a runtime may reuse its output buffers in the next step
            pending.parts.append({k: np.array(v[offset:offset + count]) for k, v in outputs.items()})
            offset += count
        self.queued -= take
        self.progress(take)
        while self.pending and self.pending[0].consumed == self.pending[0].samples:
            self._finish(self.pending.popleft())

    def _finish(self, pending: _Pending) -> None:
        parts = pending.parts
        outputs = {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}
        if not pending.batched:
            outputs = {k: v[0] for k, v in outputs.items()}
        self.done(pending.item, outputs, pending.samples)


@dataclass
class _Pending:
    """An item in the queue: its arrays, how many samples went into steps and the outputs they gave."""

    item: Item
    arrays: dict[str, np.ndarray]
    batched: bool
    samples: int
    consumed: int = 0
    parts: list[dict[str, np.ndarray]] = field(default_factory=list)


class _StopRequest:
    """Context: SIGINT and SIGTERM (in the main thread) raise :class:`KeyboardInterrupt`, except the first one once
    ``soft`` is set (the model loaded): that one sets ``requested``, and the run stops between steps."""

    def __init__(self) -> None:
        self.requested = False
        self.soft = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.soft and not self.requested:
            self.requested = True
            return
        raise KeyboardInterrupt

    def __enter__(self) -> _StopRequest:
        for number in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[number] = signal.signal(number, self._handle)
            except ValueError:  # not the main thread: signals stay as they are
                break
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def _read_ahead(pool: ThreadPoolExecutor, items: Sequence[Item], read: Callable[[Path], Any]
                ) -> Iterator[tuple[Item, Future]]:
    """``(item, future of read(item.path))`` in order, with up to ``READ_AHEAD`` reads under way."""
    ahead: deque[tuple[Item, Future]] = deque()
    rest = iter(items)
    while True:
        while len(ahead) < READ_AHEAD and (item := next(rest, None)) is not None:
            ahead.append((item, pool.submit(read, item.path)))
        if not ahead:
            return
        yield ahead.popleft()


def _samples_hint(path: Path, inputs: Sequence[TensorSpec]) -> int:
    """The samples of an input file from its first array's header (0 if unknown): the progress bar's total."""
    try:
        with open(path, "rb") as handle:
            if handle.read(6) == b"\x93NUMPY":
                handle.seek(0)
                shape = _header_shape(handle)
            else:
                handle.seek(0)
                with zipfile.ZipFile(handle) as archive, archive.open(f"{inputs[0].name}.npy") as member:
                    shape = _header_shape(member)
    except Exception:  # a hint only: reading the file reports what is wrong with it
        return 0
    return 1 if len(shape) == len(inputs[0].shape) else (shape[0] if shape else 0)


def _header_shape(handle: Any) -> tuple[int, ...]:
    version = np.lib.format.read_magic(handle)
    reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}[version]
    return tuple(reader(handle)[0])
