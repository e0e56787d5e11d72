"""The README and the documentation site (mkdocs.yml, docs/): the site builds in strict mode, its reference matches
the code, its examples are real, and it renders in a real headless browser (Debian's chromium, driven by Playwright).
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

import modak.errors
import modak.limits
from modak.spec.loader import load_spec, validate
from modak.spec.models import Job
from modak.spec.target import Target

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$')

# Spec fields whose msgspec model has no description yet (object.field). Frozen: it can only shrink; a field
# documented since must leave it, and a new field must come with its description. Every field has one now.
UNDESCRIBED: frozenset[str] = frozenset()


def _reference():
    """docs/gen_reference.py, the hook that generates the reference, as a module."""
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _reference()


def _pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def _blocks(path: Path) -> list[tuple[str, str]]:
    """(language, text) of every fenced block of a markdown file (code blocks inside list items included)."""
    text = re.sub(r"^[ \t]+(?=```)", "", path.read_text(), flags=re.M)
    return [(m[1], m[2]) for m in FENCE.finditer(text)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built with `mkdocs build --strict` (broken links, missing pages and every warning fail it)."""
    out = tmp_path_factory.mktemp("site")
    # NO_MKDOCS_2_WARNING: Material 9.7 prints a notice about MkDocs 2.0 on every build; it is not about this site.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                             "-d", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    print(f"mkdocs build --strict: {time.monotonic() - start:.1f} s")
    return out


def _html(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text()


def test_the_site_builds_strict_and_offline(site: Path) -> None:
    for page in ("tutorials/first-plan", "reference/cli", "reference/job", "lab-notes/perfmodels"):
        assert (site / page / "index.html").is_file(), page
    external = re.compile(r'<(?:script|link)[^>]+(?:src|href)="(https?:)?//', re.I)
    for html in site.rglob("*.html"):
        assert not external.search(html.read_text()), f"{html}: loads a script or stylesheet from the network"


def test_every_flag_of_every_command_is_on_the_cli_page_with_its_help(site: Path) -> None:
    page = _html(site, "reference/cli")
    for which in ("host", "image"):
        parser = gen.parser(which)
        assert gen.undocumented(parser) == []
        for command, sub in gen.commands(parser):
            assert f"<code>{command}</code>" in page, command
            for name, _ in gen.arguments(sub):
                assert f"<code>{name}</code>" in page, f"{command} {name}"


def test_a_flag_without_help_fails_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from modak import cli

    build = cli._parser

    def with_a_bare_flag():
        parser = build()
        dict(gen.commands(parser))["modak plan"].add_argument("--undocumented-flag", action="store_true")
        return parser

    monkeypatch.setattr(cli, "_parser", with_a_bare_flag)
    assert gen.undocumented(cli._parser()) == ["modak plan --undocumented-flag"]
    with pytest.raises(ValueError, match="modak plan --undocumented-flag"):
        gen.cli("host")


@pytest.mark.parametrize("module", [modak.errors, modak.limits], ids=["errors", "limits"])
def test_every_exit_code_and_limit_is_documented_on_its_page(site: Path, module) -> None:
    page = _html(site, "reference/limits")
    prefix = "EXIT_" if module is modak.errors else "MAX_"
    documented = {name for name, _, doc in gen.documented_constants(Path(module.__file__)) if doc}
    constants = {name for name in vars(module) if name.startswith(prefix)}
    assert constants <= documented, f"constants without a docstring: {sorted(constants - documented)}"
    for name in documented:
        assert f"<code>{name}</code>" in page, name
    if module is modak.errors:
        assert "Build failed" in page and "<code>5</code>" in page


def test_every_spec_field_is_on_its_page_and_the_undescribed_list_only_shrinks(site: Path) -> None:
    from modak.api import schemas

    undescribed = set()
    for kind in ("job", "target"):
        page = _html(site, f"reference/{kind}")
        for obj, field, schema in gen.spec_fields(schemas()[kind]):
            assert f"<code>{field}</code>" in page, f"{obj}.{field}"
            if not schema.get("description"):
                undescribed.add(f"{obj}.{field}")
    assert not undescribed - UNDESCRIBED, f"new spec fields without a description: {sorted(undescribed - UNDESCRIBED)}"
    assert not UNDESCRIBED - undescribed, f"described now, remove from UNDESCRIBED: {sorted(UNDESCRIBED - undescribed)}"


def test_the_json_documents_and_runtimes_are_on_their_pages(site: Path) -> None:
    page = _html(site, "reference/json-schemas")
    for path in (ROOT / "modak" / "schemas").glob("*.schema.json"):
        assert path.name in page
    page = _html(site, "reference/runtimes")
    for path in (ROOT / "recipes" / "runtimes").glob("*.yaml"):
        recipe = yaml.safe_load(path.read_text())
        assert f"<code>{recipe['name']}</code>" in page
        for parameter in recipe.get("parameters", []):
            assert f"<code>{parameter['name']}</code>" in page, (recipe["name"], parameter["name"])


def test_every_plot_is_drawn_from_its_data_and_shown(site: Path) -> None:
    """docs/gen_plots.py draws each plot from the stored measurements at build time; each is on a page, and the
    same data give the same bytes (no build date in the SVG)."""
    sys.path.insert(0, str(ROOT / "docs"))
    import gen_plots

    pages = "".join(path.read_text() for path in site.rglob("*.html"))
    for name, draw in gen_plots.PLOTS.items():
        built = (site / name).read_bytes()
        assert built.startswith(b"<?xml") and b"<svg" in built[:1000], name
        assert built == draw(), f"{name}: drawn twice from the same data, other bytes"
        assert Path(name).name in pages, f"{name} is on no page"


def _check_spec_file(path: Path) -> None:
    from modak.hardware.local import local_sections  # `cpu: local`: the session's host probe (tests/conftest.py)

    kind = yaml.safe_load(path.read_text()).get("kind")
    load_spec(path, {"Job": Job, "Target": Target}[kind], local_machine=local_sections)


def test_every_yaml_example_is_an_included_file_or_a_valid_spec() -> None:
    base = yaml.safe_load((ROOT / "examples" / "own-model-cpu" / "job.yaml").read_text())
    checked = 0
    for path in [README, *_pages()]:
        for language, text in _blocks(path):
            if language != "yaml":
                continue
            checked += 1
            lines = text.strip().splitlines()
            if len(lines) == 1 and (m := SNIPPET.match(lines[0])):
                included = ROOT / m[1]
                assert m[1].startswith("examples/") and included.is_file(), f"{path}: includes {m[1]}"
                if included.name in ("job.yaml", "target.yaml"):
                    _check_spec_file(included)
                else:
                    yaml.safe_load(included.read_text())
                continue
            data = yaml.safe_load(text)
            if data.get("kind") in ("Job", "Target"):
                validate(data, {"Job": Job, "Target": Target}[data["kind"]])
            else:  # a fragment of a job: valid within the own-model example's job
                validate({**base, **data}, Job)
    assert checked >= 10


def test_every_example_spec_parses() -> None:
    specs = [p for p in (ROOT / "examples").rglob("*.yaml") if yaml.safe_load(p.read_text()).get("apiVersion")
             == "modak/v1"]
    assert len(specs) >= 15
    for path in specs:
        _check_spec_file(path)


def test_the_ci_examples_use_the_action_and_the_template_as_they_are() -> None:
    inputs = set(yaml.safe_load((ROOT / "action.yml").read_text())["inputs"])
    workflow = yaml.safe_load((ROOT / "examples" / "ci" / "github-workflow.yml").read_text())
    steps = [s for job in workflow["jobs"].values() for s in job["steps"] if "modak" in s.get("uses", "")]
    assert steps and all(set(s["with"]) <= inputs for s in steps), (inputs, steps)
    template = yaml.safe_load((ROOT / "integrations" / "gitlab" / "modak.gitlab-ci.yml").read_text())
    gitlab = yaml.safe_load((ROOT / "examples" / "ci" / "gitlab-ci.yml").read_text())
    extended = {job["extends"] for job in gitlab.values() if isinstance(job, dict) and "extends" in job}
    assert extended and extended <= set(template)


def _modak_calls(text: str) -> list[list[str]]:
    """The words of each `modak ...` command in a shell block, from `modak` to the end of its command."""
    calls = []
    for line in text.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, word in enumerate(words):
            # a command's first word (after a pipe or a list, or an image's command after IMAGE), not a folder
            if word == "modak" and (i == 0 or words[i - 1] in ("|", "&&", ";", "(", "IMAGE")):
                end = next((j for j in range(i + 1, len(words)) if words[j] in ("|", "&&", ";", ">", "2>")),
                           len(words))
                calls.append(words[i + 1:end])
    return calls


def test_every_modak_command_and_flag_in_a_shell_example_exists() -> None:
    commands: dict[str, set[str]] = {}
    for which in ("host", "image"):
        for command, sub in gen.commands(gen.parser(which)):
            flags = {f for action in sub._actions for f in action.option_strings}
            commands.setdefault(command.removeprefix("modak "), set()).update(flags)
    checked = 0
    for path in [README, *_pages()]:
        for language, text in _blocks(path):
            if language not in ("bash", "console", "shell", "sh"):
                continue
            for words in _modak_calls(text):
                if not words or words[0].startswith("$"):
                    continue
                name = " ".join(words[:2]) if " ".join(words[:2]) in commands else words[0]
                assert name in commands, f"{path}: modak {' '.join(words)}: no such command"
                for word in words:
                    flag = word.split("=", 1)[0]
                    if flag.startswith("-") and flag != "-":
                        assert flag in commands[name], f"{path}: modak {name} has no {flag}"
                checked += 1
    assert checked >= 20


def test_the_readme_is_a_front_door_and_its_test_command_is_what_ci_runs() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 250
    fenced = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            assert len(line) <= 120, f"README.md:{number}: {len(line)} characters"
    tests = text.split("## Tests", 1)[1]
    readme_command = FENCE.search(tests)[2].strip()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line and
          not line.startswith("#")]
    assert ci == [readme_command]
    for target in re.findall(r"\]\((docs/[^)#]+|perfmodels/[^)#]+)", text) + re.findall(r"^\[\d+\]: (\S+?)(?:#|$)",
                                                                                         text, re.M):
        assert (ROOT / target).is_file(), f"README links to {target}"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
def test_the_site_renders_in_a_headless_browser(site: Path) -> None:
    """Home, a tutorial and the CLI reference, opened over HTTP in Chromium: title, heading and navigation rendered,
    no request leaves the machine; a screenshot of each is kept in $MODAK_ARTIFACTS (the CI artifact)."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is not installed: run `.ci/provision.sh chromium` (apt-get install -y chromium)")
    artifacts = Path(os.environ.get("MODAK_ARTIFACTS") or site.parent / "artifacts") / "docs"
    artifacts.mkdir(parents=True, exist_ok=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    pages = {"home": ("", "modak"), "tutorial": ("tutorials/first-plan/", "Your first plan and build"),
             "cli": ("reference/cli/", "Command line")}
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            outside: list[str] = []
            page.on("request", lambda request: None if request.url.startswith(base) else outside.append(request.url))
            for name, (path, heading) in pages.items():
                page.goto(base + path, wait_until="load")
                assert "modak" in page.title()
                assert page.locator("h1").first.inner_text().removesuffix("¶").strip() == heading  # ¶: the permalink
                nav = page.locator("nav.md-nav--primary").first
                assert nav.is_visible()
                assert all(section in nav.inner_text() for section in ("Tutorials", "How-to", "Reference"))
                assert nav.locator("a").count() >= 30
                page.screenshot(path=str(artifacts / f"{name}.png"), full_page=False)
            assert page.locator("h3", has_text="modak plan").count() >= 1  # the last page: the CLI reference
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert not outside, f"requests left the machine: {outside}"
    assert all((artifacts / f"{name}.png").stat().st_size > 10_000 for name in pages)
