"""The JSON Schemas of modak's documents that are generated from their typed records, and the command that writes
them to ``modak/schemas/`` (``tests/test_documents.py`` checks that the shipped files are these):

    python -m modak.documents.schemas            # write them
    python -m modak.documents.schemas --check    # exit 1 where a shipped schema is not the generated one
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from modak.documents import analysis, build, check, evaluation, generated_schema, pack, render, scale, whatif
from modak.documents import plan as plan_document

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
# name (modak/schemas/NAME.schema.json) -> the document's root record, title and description
GENERATED: dict[str, tuple[type, str, str]] = {
    schema[0]: (root, *schema[1:]) for schema, root in (
        (analysis.SCHEMA, analysis.AnalysisDocument),
        (build.SCHEMA, build.BuildDocument),
        (check.SCHEMA, check.CheckDocument),
        (check.BASELINE_SCHEMA, check.BaselineDocument),
        (evaluation.SCHEMA, evaluation.EvaluationDocument),
        (pack.SCHEMA, pack.PackDocument),
        (plan_document.SCHEMA, plan_document.PlanDocument),
        (render.SCHEMA, render.RenderDocument),
        (scale.SCHEMA, scale.ScaleDocument),
        (whatif.SCHEMA, whatif.WhatIfDocument),
    )
}


def generated() -> dict[str, str]:
    """The text of each generated schema file, by name."""
    def text(schema: dict[str, Any]) -> str:
        return json.dumps(schema, indent=2) + "\n"
    return {name: text(generated_schema(root, name, title, description))
            for name, (root, title, description) in GENERATED.items()}


def main(argv: list[str]) -> int:
    stale = []
    for name, text in generated().items():
        path = SCHEMAS / f"{name}.schema.json"
        if "--check" in argv:
            stale += [path.name] if not path.is_file() or path.read_text() != text else []
        else:
            path.write_text(text)
    if stale:
        print(f"not the generated schemas: {', '.join(stale)} (python -m modak.documents.schemas)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
