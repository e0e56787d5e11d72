"""The user's own model (``model.pytorch``, ``model.exported``), loaded and exported in a child process only.

The planner never imports the user's code: :mod:`modak.workload.usercode_child` does, under a memory limit
(``RLIMIT_AS``) and a wall-clock limit (:data:`SECONDS_VARIABLE`, :data:`MEMORY_VARIABLE`), and reports what it
made, or the job's field, the user's file:line and the exception's message, which become one located input
error. What it made (the ONNX export, or the FLOP counts where no exporter could export the model) is cached
under ``modak.paths.cache_dir() / "usermodels"``, keyed by the digests of the module file, the weights, the
factory's arguments and the program, with the input shapes, the torch version and the child's code; a folder is
renamed into place whole, so that nothing half-written is ever read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modak.documents.plan import ModelSource
from modak.errors import InputError, ModakError
from modak.paths import cache_dir, file_digest, folder_digest, installed
from modak.spec.loader import LoadedJob
from modak.spec.resolve import module_code
from modak.workload import usercode_child
from modak.workload.analysis import OpStats

SECONDS_VARIABLE = "MODAK_USERCODE_SECONDS"  # wall-clock limit of the user's code (load, run, export), seconds
MEMORY_VARIABLE = "MODAK_USERCODE_MEMORY_GB"  # its address-space limit, GiB
DEFAULT_SECONDS = 600.0
DEFAULT_MEMORY_GB = 32.0
_CHILD = "modak.workload.usercode_child"
# The request's paths: where the job's folder is, not what the model is (the digests say that), so that a copy
# of the folder elsewhere hits the cache.
_PATHS = ("search", "root", "module_file", "weights", "exported")
_STACK_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


@dataclass(frozen=True)
class UserModel:
    """What the child made of the user's model: where it came from, the ONNX export (or why there is none) and,
    without one, the FLOPs and bytes of its leaf modules at :data:`usercode_child.EXPORT_BATCH`."""

    source: str  # "model.py:build_model" or "program model.pt2"
    folder: Path  # the cache folder of the export
    exporter: str | None  # dynamo | torchscript; None: no exporter could export the model
    export_failures: tuple[str, ...]  # why each exporter that was tried failed
    input_shapes: dict[str, list[int]]
    digests: dict[str, str]  # module, weights, kwargs, program: sha256 of each the model has
    parameters: int
    parameter_bytes: int
    counted: tuple[OpStats, ...] | None  # the flop counter's ops, when there is no ONNX graph
    torch_version: str
    export_seconds: float  # what the first plan of this model paid for loading and exporting it
    by_keyword: bool  # called by keyword (modak.image.calling.by_keyword), else positionally
    outputs: tuple[str, ...]  # the tensors of its outputs by name (modak.image.calling.flatten)
    dropped_outputs: tuple[str, ...]  # what it returns that is not a tensor, left out of the export

    @property
    def onnx_path(self) -> Path | None:
        return self.folder / usercode_child.MODEL_FILE if self.exporter else None

    def why_no_onnx(self) -> str:
        """Why the ONNX runtimes have no graph (only when no exporter could export the model)."""
        return "no ONNX exporter could export the model (" + "; ".join(self.export_failures) + ")"

    def counted_ops(self, batch: int) -> tuple[OpStats, ...]:
        """The flop counter's ops scaled from the count's batch to ``batch`` (weights do not scale)."""
        scale = batch / usercode_child.EXPORT_BATCH
        return tuple(OpStats(op.name, op.op_type, op.op_class, round(op.macs * scale), round(op.flops * scale),
                             round(op.input_bytes * scale), op.weight_bytes, round(op.output_bytes * scale))
                     for op in self.counted or ())

    def record(self) -> ModelSource:
        """The plan's ``model_source``: the source, the exporter (or why none) and the digests."""
        return ModelSource(source=self.source, exporter=self.exporter,  # type: ignore[arg-type]
                           export_failures=list(self.export_failures),
                           call="keyword" if self.by_keyword else "positional", outputs=list(self.outputs),
                           dropped_outputs=list(self.dropped_outputs), digests=dict(self.digests),
                           torch=self.torch_version, export_seconds=round(self.export_seconds, 2))


def load_user_model(loaded: LoadedJob) -> UserModel:
    """The user's model of ``loaded`` (``model.pytorch`` or ``model.exported``), from the cache or made by the
    child; a failure of the user's code is an :class:`InputError` at the job's field."""
    doc = loaded.job_doc
    seconds, memory_gb = _limit(SECONDS_VARIABLE, DEFAULT_SECONDS), _limit(MEMORY_VARIABLE, DEFAULT_MEMORY_GB)
    request, digests = _request(loaded)
    key = hashlib.sha256(json.dumps({"request": {k: v for k, v in request.items() if k not in _PATHS},
                                     "digests": digests, "torch": _torch_version(),
                                     "child": _child_digest()}, sort_keys=True).encode()).hexdigest()[:32]
    folder = cache_dir() / "usermodels" / key
    if (folder / usercode_child.RESULT_FILE).is_file():
        return _user_model(loaded, folder, digests, None)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{key}."))
    try:
        started = time.monotonic()
        (staging / "request.json").write_text(json.dumps({**request, "seconds": seconds,
                                                          "memory_bytes": int(memory_gb * 2**30)}))
        _run_child(staging, seconds, memory_gb, loaded)
        result = json.loads((staging / usercode_child.RESULT_FILE).read_text())
        if not result["ok"]:
            raise doc.error(result["field"], _message(result, memory_gb))
        staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        for name in ("request.json", usercode_child.PHASE_FILE, usercode_child.STACK_FILE):
            (staging / name).unlink(missing_ok=True)
        seconds_taken = round(time.monotonic() - started, 3)  # as the cache keeps it: later plans say the same
        (staging / "seconds").write_text(f"{seconds_taken:.3f}")
        try:
            os.rename(staging, folder)  # atomic: readers see the whole folder or none
        except OSError:
            if not (folder / usercode_child.RESULT_FILE).is_file():  # not a concurrent export that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _user_model(loaded, folder, digests, seconds_taken)


def _request(loaded: LoadedJob) -> tuple[dict[str, Any], dict[str, str]]:
    """What the child is asked to do, and the digests of the user's files and arguments."""
    spec, files = loaded.job.model, loaded.files
    shapes = spec.input_shape
    input_shapes = {"input": list(shapes)} if isinstance(shapes, list) else (
        {k: list(v) for k, v in shapes.items()} if shapes is not None else None)
    request: dict[str, Any] = {"search": str(loaded.job_doc.path.parent.resolve()), "input_shapes": input_shapes,
                               "module": None, "module_file": None, "factory": None, "kwargs": {}, "weights": None,
                               "exported": None, "root": str(loaded.job_doc.path.parent.resolve()),
                               "input_dtype": spec.input_dtype, "input_high": spec.input_high}
    digests: dict[str, str] = {}
    if spec.pytorch is not None:
        assert files.model_module is not None
        code = module_code(spec.pytorch.module, files.model_module)
        root = code.parent if code.is_file() else code  # a traceback's frames in the user's code are below it
        request.update(module=spec.pytorch.module, module_file=str(files.model_module), factory=spec.pytorch.factory,
                       kwargs=spec.pytorch.kwargs, weights=str(files.weights) if files.weights else None,
                       root=str(root))
        # a package: every .py file of it (a model module imports its siblings)
        digests["module"] = file_digest(code) if code.is_file() else folder_digest(code, "*.py")
        digests["kwargs"] = hashlib.sha256(json.dumps(spec.pytorch.kwargs, sort_keys=True).encode()).hexdigest()
        if files.weights is not None:
            digests["weights"] = file_digest(files.weights)
    else:
        assert files.exported is not None
        request["exported"] = str(files.exported)
        digests["program"] = file_digest(files.exported)
    return request, digests


def _torch_version() -> str:
    version = installed().version("torch")
    if version is None:
        raise ModakError("the user's own PyTorch model needs PyTorch: pip install 'modak[torch]'")
    return version


def _child_digest() -> str:
    return hashlib.sha256(Path(usercode_child.__file__).read_bytes()).hexdigest()[:16]


def _limit(variable: str, default: float) -> float:
    text = os.environ.get(variable)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise InputError(f"expected a positive number, got {text!r}", field=variable)
    return value


def run_child(loaded: LoadedJob, child: str, work: dict[str, Any]) -> dict[str, Any]:
    """The result of child module ``child`` (``python -m child FOLDER``, a :func:`usercode_child.main` with its own
    work) on the user's model of ``loaded``, its request extended with ``work``, under the export's limits, in a
    folder of its own that is removed after; a failure is an :class:`InputError` at the job's field."""
    seconds, memory_gb = _limit(SECONDS_VARIABLE, DEFAULT_SECONDS), _limit(MEMORY_VARIABLE, DEFAULT_MEMORY_GB)
    request, _ = _request(loaded)
    with tempfile.TemporaryDirectory(prefix="modak-usercode-") as name:
        folder = Path(name)
        (folder / "request.json").write_text(json.dumps({**request, **work, "seconds": seconds,
                                                         "memory_bytes": int(memory_gb * 2**30)}))
        _run_child(folder, seconds, memory_gb, loaded, child)
        result: dict[str, Any] = json.loads((folder / usercode_child.RESULT_FILE).read_text())
    if not result["ok"]:
        raise loaded.job_doc.error(result["field"], _message(result, memory_gb))
    return result


def model_digests(loaded: LoadedJob) -> dict[str, str]:
    """The sha256 digests of the user's model files and arguments (module, weights, kwargs, program)."""
    return _request(loaded)[1]


def _run_child(folder: Path, seconds: float, memory_gb: float, loaded: LoadedJob, child_module: str = _CHILD
               ) -> None:
    """Run the child (``child_module``) on ``folder`` within ``seconds`` (then kill its whole process group), in
    the job file's folder (the user's relative paths are relative to it); its output goes to ``folder/log``. A
    child that did not write its result is an error at the field of the phase it was in."""
    package_parent = str(Path(usercode_child.__file__).resolve().parents[2])  # modak itself, for ``-m``
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1",  # nothing written into the user's folders
           "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)}
    with (folder / "log").open("wb") as log:
        child = subprocess.Popen([sys.executable, "-m", child_module, str(folder)], stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT, cwd=loaded.job_doc.path.parent, env=env,
                                 start_new_session=True)
        try:
            child.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise loaded.job_doc.error(_phase(folder), f"{_stack_location(folder)}the model's code did not finish "
                                                       f"within {seconds:g} s ({SECONDS_VARIABLE}); it was "
                                                       "stopped") from None
        except BaseException:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise
    if not (folder / usercode_child.RESULT_FILE).is_file():
        code = child.returncode
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        raise loaded.job_doc.error(_phase(folder), f"the model's code ended its process ({how}) before it was done"
                                                   f"{_last_line(folder / 'log')} (memory limit {memory_gb:g} GiB: "
                                                   f"{MEMORY_VARIABLE})")


def _phase(folder: Path) -> str:
    try:
        return (folder / usercode_child.PHASE_FILE).read_text() or "model"
    except OSError:
        return "model"


def _stack_location(folder: Path) -> str:
    """``file:line: `` of the innermost frame of the main thread in the child's stack dump that is the user's
    code (the request's root), or nothing."""
    try:
        dump = (folder / usercode_child.STACK_FILE).read_text()
        root = Path(json.loads((folder / "request.json").read_text())["root"])
    except (OSError, ValueError, KeyError):
        return ""
    for match in _STACK_FRAME.finditer(dump):  # each thread's innermost frame first
        path = Path(match["file"])
        if path == root or path.is_relative_to(root):
            return f"{match['file']}:{match['line']}: "
    return ""


def _last_line(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f": {lines[-1].strip()[:200]}" if lines else ""


def _message(result: dict[str, Any], memory_gb: float) -> str:
    """The child's failure as one message: the user's file:line, then what happened."""
    where = f"{result['file']}:{result['line']}: " if result.get("file") else ""
    message = result["message"]
    if "MemoryError" in message or "allocate memory" in message:
        message += f" (the model's code may use {memory_gb:g} GiB: {MEMORY_VARIABLE})"
    return where + message


def _user_model(loaded: LoadedJob, folder: Path, digests: dict[str, str], seconds: float | None) -> UserModel:
    result = json.loads((folder / usercode_child.RESULT_FILE).read_text())
    spec = loaded.job.model
    source = (f"{spec.pytorch.module}:{spec.pytorch.factory}" if spec.pytorch is not None
              else f"program {spec.exported}")
    counted = (tuple(OpStats(**op) for op in result["counted"]) if result["counted"] is not None else None)
    if seconds is None:
        seconds = float((folder / "seconds").read_text())
    return UserModel(source, folder, result["exporter"], tuple(result["failures"]),
                     {k: list(v) for k, v in result["input_shapes"].items()}, digests, result["parameters"],
                     result["parameter_bytes"], counted, result["torch"], seconds, result["by_keyword"],
                     tuple(result["outputs"]), tuple(result["dropped_outputs"]))
