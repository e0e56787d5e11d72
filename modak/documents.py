"""The JSON documents modak prints (``--json``) and writes (``plan.json``, check baselines): one schema version,
one envelope (docs/json-output.md, JSON Schemas in ``modak/schemas/``)."""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1


def document(body: dict[str, Any]) -> dict[str, Any]:
    """A JSON document as modak prints it: ``schema_version`` first, then ``body``."""
    return {"schema_version": SCHEMA_VERSION, **body}


def rounded(value: float) -> float:
    """``value`` to 6 significant digits, as the documents carry measured and predicted figures."""
    return float(f"{value:.6g}")


def duration(seconds: float) -> str:
    """A duration for reasons and tables: milliseconds below a second, else seconds (3 significant digits)."""
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"
