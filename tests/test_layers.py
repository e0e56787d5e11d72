"""The import graph points one way: spec -> workload -> candidates -> predict -> plan -> render/bench -> build ->
advise -> api -> output -> cli, with the data layers (measurements, hardware) below prediction and the in-image
package at the bottom. Read from the source (every import, at any depth, TYPE_CHECKING blocks included), not from
sys.modules."""

from __future__ import annotations

import ast
from pathlib import Path

import modak

PACKAGE = Path(modak.__file__).resolve().parent
# Rank of each top-level part of modak: a module may import its own part or a part of lower rank.
LAYERS = {
    "": 0, "errors": 0, "paths": 0,
    "registry": 0.5,  # named implementations of an extension point (stdlib only; not copied into images yet)
    "image": 1,
    "runtime": 1.2,  # the image's public API and commands, over the deployment and the runtime adapters
    "documents": 1.5,  # host-side foundation: not copied into images
    "limits": 1.5,  # the bounds on every input file (host side)
    "schedulers": 1.8,  # Slurm, PBS, bash: below the spec, whose scheduler.kind lists the registered ones
    "spec": 2,
    "hardware": 3,
    "workload": 4,
    "quantize": 4.5,  # int8 quantization and the accuracy gate: the plan checks int8 candidates with it
    "candidates": 5,
    "measurements": 6,
    "predict": 7,
    "allreduce": 7.4,  # the alpha-beta all-reduce model of data-parallel steps: links, layouts, step times
    "scaling": 7.5,  # data-parallel scaling of a plan's choice (modak scale); the plan records the workers it picks
    "plan": 8,
    "batching": 8.2,  # model.batch_size auto: the job planned at each batch size, the best plan within limits
    "render": 9, "bench": 9,
    "build": 10, "report": 10, "integrations": 10,
    "advise": 10.5,  # modak whatif and modak pack: plans on several targets or shares (the API plans them)
    "api": 11,
    "output": 11.5,  # what the command line prints: terminal tables and --json documents
    "cli": 12, "__main__": 13,
}
IN_IMAGE = {"", "errors", "paths", "image", "runtime"}  # what modak copies into images (render.package.IMAGE_PACKAGE)
NOT_IN_IMAGE = {"msgspec", "yaml", "sklearn", "scipy", "matplotlib", "jinja2", "docker", "spython", "rich"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        found[".".join(("modak", *parts))] = path
    return found


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports (absolute names), wherever the import statement is."""
    names: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def _graph() -> dict[str, set[str]]:
    """Module -> the modak modules it imports; a module's own ancestor packages are left out (Python initializes
    them before the module whatever it imports)."""
    modules = _modules()
    return {name: {m for m in _imports(name, path) if m in modules and m != name and not name.startswith(m + ".")}
            for name, path in modules.items()}


def test_every_part_has_a_layer() -> None:
    assert {_part(m) for m in _modules()} <= set(LAYERS)


def test_no_upward_imports() -> None:
    upward = sorted(f"{importer} -> {imported}" for importer, targets in _graph().items() for imported in targets
                    if LAYERS[_part(imported)] > LAYERS[_part(importer)]
                    or (LAYERS[_part(imported)] == LAYERS[_part(importer)] and _part(imported) != _part(importer)))
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_no_import_cycle() -> None:
    graph, done, cycles = _graph(), set(), []

    def visit(node: str, path: list[str]) -> None:
        for target in sorted(graph[node]):
            if target in path:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in done:
                visit(target, path + [target])
        done.add(node)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_image_package_needs_only_its_runtime() -> None:
    for name, path in _modules().items():
        if _part(name) in IN_IMAGE:
            outside = {m for m in _imports(name, path) if m.split(".")[0] in NOT_IN_IMAGE}
            assert not outside, f"{name} (in-image code) imports {sorted(outside)}"


def test_the_documented_layout_names_every_part_in_layer_order() -> None:
    """The site's layout page lists every top-level part of modak (and the repository's folders), from the top layer
    down."""
    layout = (PACKAGE.parent / "docs" / "explanation" / "layout.md").read_text()
    block = layout.split("```", 2)[1]
    listed = [line.split()[0] for line in block.splitlines() if line and not line[0].isspace()]
    parts = [entry.removeprefix("modak/").removesuffix(".py") for entry in listed if entry.startswith("modak/")]
    expected = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
                if p.name not in {"__init__.py", "__main__.py", "__pycache__", "schemas"}}
    assert set(parts) == expected
    ranks = [LAYERS[part] for part in parts]
    assert ranks == sorted(ranks, reverse=True), list(zip(parts, ranks))
    folders = {p.name + "/" for p in PACKAGE.parent.iterdir() if p.is_dir() and not p.name.startswith(".")
               and p.name not in {"modak", "out", "build", "dist", "site"} and not p.name.endswith(".egg-info")
               and p.name != "__pycache__"}
    assert folders <= set(listed), sorted(folders - set(listed))


MAX_MODULE_LINES = 600  # one room, one job (#65): a module that outgrows it is split by what its parts do
LONGER_MODULES = {"modak.image.zoo_models"}  # the zoo's architecture definitions: data written as code


def test_no_module_outgrows_its_room() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES and name not in LONGER_MODULES} == {}
