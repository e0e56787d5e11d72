"""The resolve step: every file a job and its target refer to, checked once, right after loading.

``modak plan`` therefore rejects what ``modak render`` or ``modak build`` would reject (a missing CA bundle,
an empty wheelhouse, an application file that is not there, a data path the engine's bind syntax cannot
express), each with ``FILE:LINE: field: message``. The model file and its inputs are resolved by
:mod:`modak.workload.source`, which needs the ONNX graph.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from modak.errors import InputError
from modak.image.text import TOKENIZER_FILE
from modak.image.vision import PIXEL_VALUES, PROCESSOR_FILE, read_steps
from modak.limits import GIB, MAX_APP_BYTES, MAX_APP_FILES
from modak.paths import refusal
from modak.spec.document import SpecDocument

if TYPE_CHECKING:
    from modak.spec.models import Job, ModelSpec
    from modak.spec.target import Target

APP_DIR = "/opt/app"  # where the job's entrypoint files go in the image
TEMPLATES_VARIABLE = "MODAK_TEMPLATES"  # a site template folder, after the target's container.templates


@dataclass(frozen=True)
class DataBind:
    """The job's data set: a host path, bind-mounted read-only at ``mount``; and where its results go, if it says:
    a host folder bound read-write at ``output_mount``."""

    location: str  # absolute host path (free text)
    mount: str
    output: str | None = None  # absolute host path (free text)
    output_mount: str = "/output"


@dataclass(frozen=True)
class ResolvedFiles:
    """Absolute paths of everything the job and the target refer to, checked to exist."""

    job_file: Path
    target_file: Path
    ca_bundle: Path | None
    wheels: tuple[Path, ...]  # the wheelhouse's *.whl files, sorted
    app_files: tuple[Path, ...]  # entrypoint.files, names unique (each becomes /opt/app/<name>)
    data: DataBind | None
    templates: tuple[Path, ...]  # site template folders, in lookup order (before modak's own)
    calibration: Path | None = None  # the folder of calibration samples (calibration.data)
    model_module: Path | None = None  # the file of model.pytorch.module
    weights: Path | None = None  # model.pytorch.weights
    exported: Path | None = None  # model.exported, a torch.export program
    loss_module: Path | None = None  # the file of the job's loss module (loss: module:function)
    tokenizer: Path | None = None  # the folder of model.tokenizer.path (holds tokenizer.json)
    image_processor: Path | None = None  # the folder of model.image_processor.path (preprocessor_config.json)
    preprocess_module: Path | None = None  # the file of model.preprocess.function's module
    preprocess_example: Path | None = None  # model.preprocess.example
    postprocess_module: Path | None = None  # the file of model.postprocess's module

    def inputs(self) -> tuple[Path, ...]:
        """The job's own input files (for the image's ``created`` time): spec files and application files."""
        return (self.job_file, self.target_file, *self.app_files)


def resolve_files(job: Job, target: Target, job_doc: SpecDocument, target_doc: SpecDocument) -> ResolvedFiles:
    """Resolve and check the files of ``job`` and ``target``; problems are located input errors."""
    python = target.python
    ca_bundle = None
    if python.ca_bundle:
        ca_bundle = target_doc.resolve(python.ca_bundle, ("python", "ca_bundle"))
        if not ca_bundle.is_file():
            raise target_doc.error(("python", "ca_bundle"), f"file not found: {ca_bundle}")
    wheels: tuple[Path, ...] = ()
    if python.wheelhouse:
        folder = target_doc.resolve(python.wheelhouse, ("python", "wheelhouse"))
        wheels = tuple(sorted(folder.glob("*.whl"))) if folder.is_dir() else ()
        if not wheels:
            raise target_doc.error(("python", "wheelhouse"), f"no *.whl files in {folder}")
    return ResolvedFiles(job_file=job_doc.path.resolve(), target_file=target_doc.path.resolve(),
                         ca_bundle=ca_bundle, wheels=wheels, app_files=_app_files(job, job_doc),
                         data=_data(job, target, job_doc), templates=_templates(target, target_doc),
                         calibration=_calibration(job, job_doc), **_model_files(job, job_doc))


def _model_files(job: Job, doc: SpecDocument) -> dict[str, Path]:
    """The files of the user's own model (model.pytorch, model.exported) and loss, each checked to exist."""
    files = {}
    spec = job.model
    if spec.pytorch is not None:
        files["model_module"] = module_file(spec.pytorch.module, doc, ("model", "pytorch", "module"))
        if spec.pytorch.weights is not None:
            files["weights"] = _existing_file(spec.pytorch.weights, doc, ("model", "pytorch", "weights"))
    if spec.exported is not None:
        files["exported"] = _existing_file(spec.exported, doc, ("model", "exported"))
    if spec.tokenizer is not None:
        loc = ("model", "tokenizer", "path")
        folder = doc.resolve(spec.tokenizer.path, loc)
        if not (folder / TOKENIZER_FILE).is_file():
            raise doc.error(loc, f"no {TOKENIZER_FILE} in {folder} (save the tokenizer with save_pretrained)"
                            if folder.is_dir() else f"folder not found: {folder}")
        files["tokenizer"] = folder
    if spec.image_processor is not None:
        files["image_processor"] = _image_processor(spec, doc)
    if spec.preprocess is not None:
        files["preprocess_module"] = module_file(spec.preprocess.function.rpartition(":")[0], doc,
                                                 ("model", "preprocess", "function"))
        files["preprocess_example"] = _existing_file(spec.preprocess.example, doc, ("model", "preprocess", "example"))
    if spec.postprocess is not None:
        files["postprocess_module"] = module_file(spec.postprocess.rpartition(":")[0], doc, ("model", "postprocess"))
    if job.loss is not None and ":" in job.loss:
        files["loss_module"] = module_file(job.loss.rpartition(":")[0], doc, ("loss",))
    return files


def _image_processor(spec: ModelSpec, doc: SpecDocument) -> Path:
    """The folder of ``model.image_processor``, its steps checked and the images they make the model's
    ``pixel_values``."""
    assert spec.image_processor is not None and isinstance(spec.input_shape, dict)
    loc = ("model", "image_processor", "path")
    folder = doc.resolve(spec.image_processor.path, loc)
    if not (folder / PROCESSOR_FILE).is_file():
        raise doc.error(loc, f"no {PROCESSOR_FILE} in {folder} (save the image processor with save_pretrained)"
                        if folder.is_dir() else f"folder not found: {folder}")
    try:
        made = read_steps(folder).output_shape
    except ValueError as exc:
        raise doc.error(loc, str(exc)) from None
    if made is None:
        raise doc.error(loc, "its images' size depends on each image (a shortest-edge resize without a crop); "
                             "the model takes one shape")
    if made != spec.input_shape[PIXEL_VALUES]:
        raise doc.error(("model", "input_shape"), f"the image processor makes {PIXEL_VALUES} of {made}, the "
                                                  f"input_shape says {spec.input_shape[PIXEL_VALUES]}")
    return folder


def _existing_file(relative: str, doc: SpecDocument, loc: tuple[str, ...]) -> Path:
    path = doc.resolve(relative, loc)
    if not path.is_file():
        raise doc.error(loc, f"file not found: {path}" if not path.exists() else f"not a file: {path}")
    return path


def module_code(module: str, path: Path) -> Path:
    """What holds the user's module ``module`` found at ``path``: the file (a ``.py`` file or a top-level module),
    or the folder of a dotted name's top-level package."""
    if module.endswith(".py"):
        return path
    depth = module.count(".") + (path.name == "__init__.py")
    return path.parents[depth - 1] if depth else path


def beside(reference: str) -> str:
    """``module:function`` with the module named as the image names it beside the model file (a ``.py`` file by
    its name, a dotted name as it is)."""
    module, _, function = reference.rpartition(":")
    return f"{Path(module).name if module.endswith('.py') else module}:{function}"


def module_file(module: str, doc: SpecDocument, loc: tuple[str, ...]) -> Path:
    """The file of a user's module: a ``.py`` file relative to the job file, or a dotted name looked up (without
    importing anything) in the job file's folder, then on ``sys.path``."""
    if module.endswith(".py"):
        return _existing_file(module, doc, loc)
    parts = module.split(".")
    for base in (doc.path.parent.resolve(), *(Path(p) for p in sys.path if p)):
        for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
            reason = refusal(candidate)
            if reason is not None:
                raise doc.error(loc, f"cannot use module '{module}': {reason}")
            if candidate.is_file():
                return candidate.resolve()
    raise doc.error(loc, f"module '{module}' not found: neither in {doc.path.parent.resolve()} nor importable "
                         "(give a .py file relative to the job file, or install the package)")


def _calibration(job: Job, doc: SpecDocument) -> Path | None:
    if job.calibration.data is None:
        return None
    folder = doc.resolve(job.calibration.data, ("calibration", "data"))
    if not folder.is_dir():
        raise doc.error(("calibration", "data"), f"folder not found: {folder}")
    return folder


def _app_files(job: Job, doc: SpecDocument) -> tuple[Path, ...]:
    files: list[Path] = []
    seen: dict[str, int] = {}
    for index, relative in enumerate(job.entrypoint.files if job.entrypoint else []):
        loc = ("entrypoint", "files", index)
        path = doc.resolve(relative, loc)
        if not path.exists():
            raise doc.error(loc, f"file not found: {path}")
        if path.name in seen:
            raise doc.error(loc, f"entry {seen[path.name]} is also named {path.name!r}: both would be "
                                 f"{APP_DIR}/{path.name}")
        seen[path.name] = index
        files.append(path)
    _check_app_size(files, doc)
    return tuple(files)


def _check_app_size(files: list[Path], doc: SpecDocument) -> None:
    """Refuse application files beyond :data:`MAX_APP_BYTES` or :data:`MAX_APP_FILES` (folders walked, links not
    followed), located at the entry where the total crosses a limit: all of them go into the build context."""
    count = size = 0
    for index, path in enumerate(files):
        for file in _files_under(path):
            count += 1
            with contextlib.suppress(OSError):  # a file gone meanwhile adds nothing; the build reports it
                size += file.lstat().st_size
            if count > MAX_APP_FILES or size > MAX_APP_BYTES:
                raise doc.error(("entrypoint", "files", index),
                                f"the application files reach more than {MAX_APP_FILES:,} files or "
                                f"{MAX_APP_BYTES // GIB} GiB at {path}; all of them would be copied into the build "
                                "context: list only what the job needs")


def _files_under(path: Path) -> Iterator[Path]:
    """``path`` itself, or every file under it when it is a folder (links not followed)."""
    if not path.is_dir() or path.is_symlink():
        yield path
        return
    for root, _, names in os.walk(path):
        yield from (Path(root) / name for name in names)


def _data(job: Job, target: Target, doc: SpecDocument) -> DataBind | None:
    if not job.data:
        return None
    engine = target.container.engine

    def host_path(field: str, path: str) -> str:
        path = path if path.startswith("/") else str(doc.resolve(path, ("data", field)))
        if ":" in path or (engine == "apptainer" and "," in path):
            raise doc.error(("data", field), f"the {engine} bind syntax cannot express a path "
                                             "with ':' or ','; use a path (or symbolic link) without")
        return path

    output = host_path("output", job.data.output) if job.data.output is not None else None
    return DataBind(host_path("location", job.data.location), job.data.mount, output, job.data.output_mount)


def _templates(target: Target, doc: SpecDocument) -> tuple[Path, ...]:
    """The folders of site templates, in lookup order: the target's ``container.templates``, then
    ``$MODAK_TEMPLATES``; each must be a folder."""
    folders = []
    if target.container.templates is not None:
        folder = doc.resolve(target.container.templates, ("container", "templates"))
        if not folder.is_dir():
            raise doc.error(("container", "templates"), f"folder not found: {folder}")
        folders.append(folder)
    if variable := os.environ.get(TEMPLATES_VARIABLE):
        folder = Path(variable).expanduser().resolve()
        if not folder.is_dir():
            raise InputError(f"folder not found: {folder}", field=TEMPLATES_VARIABLE)
        folders.append(folder)
    return tuple(folders)
