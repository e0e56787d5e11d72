"""The JSON documents modak prints (``--json``) and writes (``plan.json``, check baselines): one schema version,
one envelope (docs/json-output.md, JSON Schemas in ``modak/schemas/``)."""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1


def document(body: dict[str, Any]) -> dict[str, Any]:
    """A JSON document as modak prints it: ``schema_version`` first, then ``body``."""
    return {"schema_version": SCHEMA_VERSION, **body}
