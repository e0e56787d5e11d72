"""modak's in-image package as a wheel: ``modak-runtime``, built from this checkout for every image.

The wheel holds what :data:`IMAGE_PACKAGE` names (the package root, its stdlib-only foundations, the deployment
and runtime adapters of :mod:`modak.image`, the runtime API and commands of :mod:`modak.runtime`) and the ``modak``
command of images (:mod:`modak.runtime.cli`). It declares no dependencies: the image's one pip step installs the
pinned ones (the runtime's recipe, ``recipes/image.yaml``), and the wheel is installed after it with ``--no-deps``
from the build context, never looked up on an index. Built by hatchling with reproducible timestamps, so the
same sources give the same bytes and an unchanged image rebuilds from its cached layers.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import modak

DISTRIBUTION = "modak-runtime"
# modak's package root, the stdlib-only foundations it imports, the deployment and adapters, the runtime API.
IMAGE_PACKAGE = ("__init__.py", "errors.py", "paths.py", "image", "runtime")
_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "{version}"
description = "modak's in-image runtime: the plan's deployment, the modak serve/run/self-test commands"
requires-python = ">=3.10"
license = "Apache-2.0"

[project.scripts]
modak = "modak.runtime.cli:main"

[tool.hatch.build.targets.wheel]
packages = ["modak"]
"""


def source_digest() -> str:
    """sha256 of the in-image package's sources (:data:`IMAGE_PACKAGE`): the Dockerfile's install step names it,
    since an engine's layer cache does not see what a bind mount holds (a changed wheel of the same name would
    otherwise be taken from the cache)."""
    source = Path(modak.__file__).resolve().parent
    digest = hashlib.sha256()
    for entry in IMAGE_PACKAGE:
        root = source / entry
        files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts) if root.is_dir() else [root]
        for path in files:
            digest.update(f"{path.relative_to(source)}\0{path.stat().st_size}\0".encode())
            digest.update(path.read_bytes())
    return f"sha256:{digest.hexdigest()}"


def wheel_name() -> str:
    """The file name of the wheel :func:`build_wheel` writes."""
    return f"{DISTRIBUTION.replace('-', '_')}-{modak.__version__}-py3-none-any.whl"


def build_wheel(directory: Path) -> Path:
    """Build the ``modak-runtime`` wheel into ``directory``; its path."""
    from hatchling.builders.wheel import WheelBuilder

    source = Path(modak.__file__).resolve().parent
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modak-wheel-") as root:
        package = Path(root) / "modak"
        package.mkdir()
        for entry in IMAGE_PACKAGE:
            if (source / entry).is_dir():
                shutil.copytree(source / entry, package / entry, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(source / entry, package / entry)
        (Path(root) / "pyproject.toml").write_text(_PYPROJECT.format(name=DISTRIBUTION, version=modak.__version__))
        built = Path(next(WheelBuilder(root).build(directory=str(directory), versions=["standard"])))
    if built.name != wheel_name():
        raise RuntimeError(f"hatchling wrote {built.name}, expected {wheel_name()}")
    return built
