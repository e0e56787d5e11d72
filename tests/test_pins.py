"""Version pins agree: a project that pyproject.toml pins (the runtimes modak measures with) and that an image
installs (a runtime recipe, recipes/image.yaml) is pinned to the same version in both, so what was measured is
what images get."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from modak.candidates.catalog import load_catalog
from modak.paths import data_dir
from modak.render.ir import image_requirements

ROOT = Path(__file__).resolve().parent.parent
_REQUIREMENT = re.compile(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?(==\S+)?")


def _split(requirement: str) -> tuple[str, str | None]:
    match = _REQUIREMENT.fullmatch("".join(requirement.split()))
    assert match, requirement
    return match[1].lower().replace("_", "-"), match[2][2:] if match[2] else None


def _image_requirements() -> list[tuple[str, str]]:
    """(where, requirement) of everything an image may install."""
    found = [("recipes/image.yaml", r) for r in image_requirements()]
    for recipe in load_catalog().values():
        found += [(f"recipes/runtimes ({recipe.name}/{device})", r)
                  for device, needs in recipe.container.items() for r in needs.pip]
    return found


def test_images_pin_what_pyproject_pins() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = dict(_split(r) for group in [project["dependencies"], *project["optional-dependencies"].values()]
                  for r in group if "==" in r)
    disagree = [f"{where}: {requirement} (pyproject.toml: =={pinned[name]})"
                for where, requirement in _image_requirements()
                for name, version in [_split(requirement)] if name in pinned and version != pinned[name]]
    assert not disagree, "pins disagree:\n" + "\n".join(disagree)


def test_image_yaml_is_pinned() -> None:
    requirements = yaml.safe_load((data_dir("recipes") / "image.yaml").read_text())["requirements"]
    assert requirements and all(_split(r)[1] for r in requirements)
