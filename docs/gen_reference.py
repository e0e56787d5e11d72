"""The site's reference, generated from the code at every build (a MkDocs hook, ``hooks:`` in mkdocs.yml).

A page holds a marker, ``<!-- modak:NAME ARG -->``, and the hook replaces it by the markdown of NAME:
``cli host|image`` (every command and flag of :func:`modak.cli._parser` or of the image's
:func:`modak.runtime.cli.parser`), ``spec job|target`` (the fields of the JSON Schema of ``modak schema``),
``constants errors|limits`` (the documented constants of ``modak/errors.py`` and ``modak/limits.py``),
``runtimes`` (the runtime recipes' parameters, ``recipes/runtimes/``) and ``json`` (the JSON Schemas of the
``--json`` documents in ``modak/schemas/``). A flag without help text fails the build; ``tests/test_docs.py``
checks the built pages against the code.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the reference documents this checkout's modak, not another one installed
CONSTRAINTS = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<",
               "minLength": "length ≥", "maxLength": "length ≤"}
MARKER = re.compile(r"<!-- modak:(\w[\w-]*)(?: (\S+))? -->")


def commands(parser: argparse.ArgumentParser, prefix: str = "modak") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command line below ``parser`` (``modak plan``, ``modak kernels import``, ...), with its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub
                yield from commands(sub, f"{prefix} {name}")


def arguments(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """A command's own arguments (not -h, not its subcommands), each named as on the command line."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        yield ", ".join(action.option_strings) or (action.metavar or action.dest), action


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help argparse prints for ``action`` (``%(default)s`` and ``%(choices)s`` expanded)."""
    return parser._get_formatter()._expand_help(action) if action.help else ""


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """``command flag`` of every argument that has no help text."""
    return [f"{command} {name}" for command, sub in commands(parser) for name, action in arguments(sub)
            if not help_text(sub, action).strip()]


def _cell(text: Any) -> str:
    """Text for a table cell: one line, its pipes escaped outside code spans (a table keeps those whole)."""
    parts = str(text).replace("\n", " ").split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))


def parser(which: str) -> argparse.ArgumentParser:
    """``host``: the modak command (:func:`modak.cli._parser`); ``image``: the image's
    (:func:`modak.runtime.cli.parser`)."""
    if which == "image":
        from modak.runtime.cli import parser as image_parser

        return image_parser()
    from modak import cli

    return cli._parser()


def cli(which: str) -> str:
    parser_ = parser(which)
    missing = undocumented(parser_)
    if missing:
        raise ValueError(f"flags without help text (add help= in modak/cli.py): {', '.join(missing)}")
    out = []
    for command, sub in commands(parser_):
        out += [f"### `{command}`", "", _cell(sub.description or ""), "", "```text",
                sub.format_usage().removeprefix("usage: ").strip(), "```", ""]
        rows = list(arguments(sub))
        if rows:
            out += ["| argument | default | what it does |", "|---|---|---|"]
            for name, action in rows:
                default = action.default if action.default not in (None, False, argparse.SUPPRESS) else ""
                if isinstance(action, argparse._StoreFalseAction):
                    default = ""
                out.append(f"| `{name}` | {_cell(default)} | {_cell(help_text(sub, action))} |")
            out.append("")
    return "\n".join(out)


def _type(schema: dict[str, Any], link: bool = True) -> str:
    """A field's type in words, a ``$ref`` as a link to its table (or its name)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})" if link else f"`{name}`"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_type(s, link) for s in schema["anyOf"] if s.get("type") != "null") + " (or null)" * any(
            s.get("type") == "null" for s in schema["anyOf"])
    kind = schema.get("type", "any")
    bounds = [f"{word} {schema[key]}" for key, word in CONSTRAINTS.items() if key in schema]
    if "pattern" in schema:
        bounds.append(f"matching `{schema['pattern']}`")
    if bounds and kind != "array":
        return f"{kind}, {', '.join(bounds)}"
    if kind == "array":
        return f"list of {_type(schema.get('items', {}), link)}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of {_type(schema['additionalProperties'], link)}"
    return kind if isinstance(kind, str) else " or ".join(kind)


def spec_fields(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(object, field, field schema) of the spec and of every object it refers to."""
    for name, obj in [(schema["title"], schema), *schema.get("$defs", {}).items()]:
        for field, sub in obj.get("properties", {}).items():
            yield name, field, sub


def spec(kind: str) -> str:
    from modak.api import schemas

    schema = schemas()[kind]
    out = []
    for name, obj in [(schema["title"], schema), *schema.get("$defs", {}).items()]:
        out += [f"### {name}", "", _cell(obj.get("description", ""))]
        if "properties" not in obj:
            out += ["", f"One of: {_type(obj)}.", ""]
            continue
        required = set(obj.get("required", []))
        out += ["", "| field | type | default | description |", "|---|---|---|---|"]
        for field, sub in obj["properties"].items():
            default = "required" if field in required else json.dumps(sub["default"]) if "default" in sub else ""
            out.append(f"| `{field}` | {_cell(_type(sub))} | {_cell(default)} | {_cell(sub.get('description', ''))} |")
        out.append("")
    return "\n".join(out)


def documented_constants(path: Path) -> list[tuple[str, str, str]]:
    """(name, value as written, docstring) of each module-level constant followed by a docstring."""
    body = ast.parse(path.read_text()).body
    found = []
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            found.append((node.targets[0].id, ast.unparse(node.value), " ".join(after.value.value.split())))
    return found


def constants(module: str) -> str:
    path = ROOT / "modak" / f"{module}.py"
    out = ["| name | value | meaning |", "|---|---|---|"]
    out += [f"| `{name}` | `{value}` | {_cell(doc)} |" for name, value, doc in documented_constants(path)]
    return "\n".join(out) + "\n"


def json_documents() -> str:
    out = []
    for path in sorted((ROOT / "modak" / "schemas").glob("*.schema.json")):
        schema = json.loads(path.read_text())
        title, description = _cell(schema.get("title", "")), _cell(schema.get("description", ""))
        out += [f"### `{path.name}`", "", f"**{title}.** {description}", ""]
        props = schema.get("properties") or schema.get("items", {}).get("properties", {})
        if props:
            out += ["| key | type | description |", "|---|---|---|"]
            out += [f"| `{k}` | {_cell(_type(v, link=False))} | "
                    f"{_cell(v.get('description', ''))} |" for k, v in props.items()]
            out.append("")
    return "\n".join(out)


def runtimes() -> str:
    import yaml

    out = []
    for path in sorted((ROOT / "recipes" / "runtimes").glob("*.yaml")):
        recipe = yaml.safe_load(path.read_text())
        precisions = "; ".join(f"{device}: {', '.join(p)}" for device, p in recipe.get("precisions", {}).items())
        out += [f"## {recipe['title']} (`{recipe['name']}`)", "",
                f"Framework `{recipe['framework']}`, tasks {', '.join(recipe['tasks'])}; precisions {precisions}"
                f"{'; the stock deployment' if recipe.get('stock') else ''}. Recipe: `recipes/runtimes/{path.name}`.",
                "", "| parameter | values | devices | precisions |", "|---|---|---|---|"]
        for p in recipe.get("parameters", []):
            values = ", ".join(f"`{v}`" for v in p["values"])
            out.append(f"| `{p['name']}` | {values} | {', '.join(p.get('devices', ['any']))} "
                       f"| {', '.join(p.get('precisions', ['any']))} |")
        out.append("")
    return "\n".join(out)


def generate(name: str, arg: str | None) -> str:
    if name == "cli" and arg:
        return cli(arg)
    if name == "spec" and arg:
        return spec(arg)
    if name == "constants" and arg:
        return constants(arg)
    if name == "json":
        return json_documents()
    if name == "runtimes":
        return runtimes()
    raise ValueError(f"unknown reference marker: modak:{name} {arg or ''}")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs hook: each marker becomes the reference it names."""
    return MARKER.sub(lambda m: generate(m[1], m[2]), markdown)
