"""Write the generated JSON Schemas of modak's documents to modak/schemas/ (``tests/test_documents.py`` checks that
the shipped files are these): ``python -m tests.support.write_schemas``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from modak.api import document_schemas

SCHEMAS = Path(__file__).resolve().parents[2] / "modak" / "schemas"


def schema_text(schema: dict) -> str:
    """A schema as the shipped file holds it."""
    return json.dumps(schema, indent=2) + "\n"


def main() -> int:
    for name, schema in document_schemas().items():
        (SCHEMAS / f"{name}.schema.json").write_text(schema_text(schema))
    return 0


if __name__ == "__main__":
    sys.exit(main())
