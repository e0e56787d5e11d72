"""A job file changed one way must fail to load with one located message: the file, the field, what is wrong."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from modak.errors import InputError
from modak.spec.loader import load_job


def assert_located(path: Path, change: Callable[[dict[str, Any]], Any], field: str, message: str) -> None:
    """``change`` the job at ``path``; loading it must raise an :class:`InputError` at ``field`` that says
    ``message``."""
    job = yaml.safe_load(path.read_text())
    change(job)
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    with pytest.raises(InputError) as info:
        load_job(path)
    assert f": {field}: " in str(info.value) and message in str(info.value), str(info.value)
