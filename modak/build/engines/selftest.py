"""The image's self-test report, as the smoke test reads it from the run's output."""

from __future__ import annotations

import json
from typing import Any


def parse_self_test(stdout: str) -> dict[str, Any] | None:
    """The self-test's JSON object: the last stdout line that is one."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None
