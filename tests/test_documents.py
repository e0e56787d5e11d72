"""The output documents are typed records from which their JSON Schemas are generated (#65 item 3): the schemas
shipped in modak/schemas/ are the generated ones, every shipped schema is generated, and a real document
validates against its schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from jsonschema import Draft202012Validator

from modak import api
from tests.support.write_schemas import SCHEMAS, schema_text

ROOT = Path(__file__).resolve().parent.parent


def test_the_shipped_schemas_are_the_generated_ones() -> None:
    generated = api.document_schemas()
    assert {path.name.removesuffix(".schema.json") for path in SCHEMAS.glob("*.schema.json")} == set(generated)
    for name, schema in generated.items():
        assert (SCHEMAS / f"{name}.schema.json").read_text() == schema_text(schema), \
            f"{name}.schema.json is not generated from its records: python -m tests.support.write_schemas"
        Draft202012Validator.check_schema(schema)


def test_a_plan_document_is_what_its_schema_says() -> None:
    """A plan validates; a key the records do not know does not."""
    schema = json.loads((SCHEMAS / "plan.schema.json").read_text())
    document = api.plan_job(ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml", predictor_name="roofline").to_dict()
    Draft202012Validator(schema).validate(document)
    document["candidates"][0]["unknown"] = 1
    assert list(Draft202012Validator(schema).iter_errors(document))


def test_modak_schema_prints_a_documents_schema() -> None:
    done = subprocess.run([sys.executable, "-m", "modak", "schema", "plan"], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert json.loads(done.stdout) == api.document_schemas()["plan"]
    done = subprocess.run([sys.executable, "-m", "modak", "schema", "nothing"], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 2 and "no schema named 'nothing'" in done.stderr, done.stderr
