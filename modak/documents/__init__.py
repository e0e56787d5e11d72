"""The JSON documents modak prints (``--json``) and writes (``plan.json``, check baselines): one schema version,
one envelope (docs/json-output.md, JSON Schemas in ``modak/schemas/``)."""

from __future__ import annotations

from typing import Annotated, Any, Final

from msgspec import Meta, Struct

SCHEMA_VERSION: Final = 1


Seconds = Annotated[float, Meta(ge=0)]
Count = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]


class Record(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Base of the typed documents and their parts: a field with a default is left out where it has it."""


def document(body: dict[str, Any]) -> dict[str, Any]:
    """A JSON document as modak prints it: ``schema_version`` first, then ``body``."""
    return {"schema_version": SCHEMA_VERSION, **body}


def rounded(value: float) -> float:
    """``value`` to 6 significant digits, as the documents carry measured and predicted figures."""
    return float(f"{value:.6g}")


def duration(seconds: float) -> str:
    """A duration for reasons and tables: milliseconds below a second, else seconds (3 significant digits)."""
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def encoded(record: Any) -> Any:
    """A typed document (a :class:`msgspec.Struct`, or what holds some) as JSON-ready builtins."""
    import msgspec

    return msgspec.to_builtins(record)


def generated_schema(root: Any, name: str, title: str, description: str) -> dict[str, Any]:
    """The JSON Schema of the typed document ``root`` (a record, or a list of them) as
    ``modak/schemas/NAME.schema.json`` ships it: its properties at the top, the records it holds under ``$defs``."""
    import msgspec

    (reference,), definitions = msgspec.json.schema_components([root], ref_template="#/$defs/{name}")
    body = definitions.pop(reference["$ref"].rsplit("/", 1)[1]) if "$ref" in reference else reference
    body.pop("title", None)
    body.pop("description", None)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://modak.dev/schemas/{name}.schema.json", "title": title, "description": description,
            **body, **({"$defs": dict(sorted(definitions.items()))} if definitions else {})}
