"""The output documents are typed records from which their JSON Schemas are generated (#65 item 3): the schemas
shipped in modak/schemas/ are the generated ones, and a real document validates against them."""

from __future__ import annotations

import json
from pathlib import Path

from jsonschema import Draft202012Validator

from modak import api
from modak.documents.schemas import GENERATED, SCHEMAS, generated

ROOT = Path(__file__).resolve().parent.parent
# The schema still written by hand: modak bench's rows (the store's Measurement columns).
HAND_WRITTEN = {"bench"}


def test_the_shipped_schemas_are_the_generated_ones() -> None:
    for name, text in generated().items():
        assert (SCHEMAS / f"{name}.schema.json").read_text() == text, \
            f"{name}.schema.json is not generated from its records: python -m modak.documents.schemas"
        Draft202012Validator.check_schema(json.loads(text))
    shipped = {path.name.removesuffix(".schema.json") for path in SCHEMAS.glob("*.schema.json")}
    assert shipped - set(GENERATED) == HAND_WRITTEN, "a schema is neither generated nor among the hand-written ones"


def test_a_plan_document_is_what_its_schema_says() -> None:
    """A plan with every optional part the CNN job has validates; a key the records do not know does not."""
    schema = json.loads((SCHEMAS / "plan.schema.json").read_text())
    document = api.plan_job(ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml", predictor_name="roofline").to_dict()
    Draft202012Validator(schema).validate(document)
    document["candidates"][0]["unknown"] = 1
    assert list(Draft202012Validator(schema).iter_errors(document))
