"""Fuzzing the command line with hostile jobs and targets: hypothesis strategies and the checks of one case.

Shared by ``tests/test_fuzz.py`` (a quick profile) and ``benchmarks/tools/fuzz.py`` (a long one). A case starts from a
bundled example's job and target, mutates their values, keys and types (hostile strings: shell metacharacters,
Jinja, newlines, NUL, very long strings, unicode; YAML tags, anchors and aliases; truncated and corrupted bytes),
runs ``modak plan``, ``render`` or ``analyze`` in-process through :func:`modak.cli.main` and checks the outcome:

* the exit code is 0 or 2 (1 is a crash), and an exit code 2 prints one line ``modak: error: ...``;
* a failed ``render`` leaves its output folder as it was (absent, or with its earlier files unchanged);
* a rendered ``entrypoint.sh`` and ``job.sh`` pass ``bash -n`` and, run with every external command a no-op,
  never execute the payload's ``echo>PWNED``; the Dockerfile and Singularity.def keep their structure (every line
  an instruction, a section or a continuation) and the payload stays inside single quotes in their shell code.

A zoo model's ``input_shape`` is left alone: every new shape is a PyTorch export (seconds each); the ONNX-file
seed (``onnx-file``, the tiny graph of :mod:`tests.support.onnx_graphs`) fuzzes shapes.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from modak.cli import main
from tests.support.onnx_graphs import write_onnx

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MARKER = "PWNED"
PAYLOADS = (
    f"$(echo>{MARKER})", f"`echo>{MARKER}`", f";echo>{MARKER};", f"|echo>{MARKER}", f"&&echo>{MARKER}",
    f"\necho>{MARKER}\n", f"'$(echo>{MARKER})'", f'"$(echo>{MARKER})"', f"${{IFS}}$(echo>{MARKER})",
    f"\\'; echo>{MARKER} #", f"x\r\nRUN echo>{MARKER}", f"x\n%post\necho>{MARKER}", f"{{{{ {MARKER} }}}}",
    f"{{% raw %}}{MARKER}{{% endraw %}}", f"{{{{ lipsum.__globals__.os.system('echo>{MARKER}') }}}}",
    f"a\x00$(echo>{MARKER})", f"--output=/tmp/x;echo>{MARKER}", f"-v /:/host $(echo>{MARKER})",
)
HOSTILE = PAYLOADS + (
    "", " ", "-", "--help", "~", "null", "yes", "no", "0", "-1", "1e400", ".inf", ".nan", "0x1F", "\t", "\x7f",
    "\u202e", "é", "日本語", "\U0001f600", "a" * 70_000, "x" * 300, "../../etc/passwd", "/etc/passwd",
    "C:\\Windows", "%s%n", "\\", '"', "'", "{", "}", "[", "]", "*", "&", "!", "#", "a:b", "a,b", "a b",
)
# Raw YAML written in place of a value: tags, anchors and aliases, flow syntax.
RAW_YAML = (
    "!!python/object/apply:os.system ['echo>PWNED']", "!!python/name:os.system", "!!binary aGVsbG8=",
    "!!binary AAAA", "!!set {a, b}", "!!omap [{a: 1}]", "!!timestamp 2001-12-14", "!!float .inf", "!!int 0o17",
    "!!str 1", "!!map {}", "!!seq []", "!unknown x", "&a [*a]", "*nowhere", "&b {k: v}", "{a: 1, a: 2}",
    "[1, [2, [3, [4]]]]", "'unterminated", "[", "|\n  block\n  text", "? [a]\n: 1", "<<: {x: 1}",
    '"\\0"', '"\\x00\\x1b[31m"', '"\\uD800"', "~", "2001-12-14", "1_000", "0b101", "-.inf", "1e999",
)
SCALARS = st.one_of(
    st.sampled_from(HOSTILE), st.text(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, -1, 2**31, 2**63, 10**100]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.sampled_from(HOSTILE[:20])
                                                                      | st.text(max_size=8),
                                                                      inner, max_size=3)), max_leaves=6)
COMMANDS = ("plan", "render", "analyze")


def example_seeds(names: tuple[str, ...] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Job and target texts of the bundled examples (``names`` of their folders, or all), plus the
    ``onnx-file`` job: the MNIST example with the tiny ONNX graph as its model."""
    folders = [p.parent for p in sorted(EXAMPLES.glob("*/job.yaml")) if names is None or p.parent.name in names]
    jobs = {f.name: (f / "job.yaml").read_text() for f in folders}
    targets = {f.name: (f / "target.yaml").read_text() for f in sorted(EXAMPLES.glob("*/"))
               if (f / "target.yaml").is_file()}
    mnist = yaml.safe_load((EXAMPLES / "mnist-cnn-cpu" / "job.yaml").read_text())
    mnist["model"] = {"onnx": "tiny.onnx", "input_shape": [4], "batch_size": 8}
    jobs["onnx-file"] = yaml.safe_dump(mnist, sort_keys=False)
    return jobs, targets


@dataclass(frozen=True)
class Case:
    """One fuzz input: the job and target files' bytes and the command line."""

    job: bytes
    target: bytes
    command: str
    target_flag: bool  # pass --target (else the job's own 'target' field names it)
    predictor: str
    existing_output: bool  # render into a folder that already holds files

    def describe(self) -> str:
        """The command line and both files, long lines cut."""
        text = (f"modak {self.command} job.yaml{' --target target.yaml' if self.target_flag else ''} "
                f"--predictor {self.predictor}{' (output folder exists)' if self.existing_output else ''}\n"
                f"--- job.yaml\n{self.job.decode('utf-8', 'backslashreplace')[:3000]}\n"
                f"--- target.yaml\n{self.target.decode('utf-8', 'backslashreplace')[:3000]}")
        return "\n".join(line if len(line) <= 200 else f"{line[:200]}... ({len(line)} characters)"
                         for line in text.splitlines())


@dataclass
class Outcome:
    """What a case did: its exit code, its stderr, and what the checks found wrong (empty: nothing)."""

    exit_code: int
    stderr: str
    problems: list[str] = field(default_factory=list)


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into ``data`` (mapping keys and list indexes), the root included."""
    found = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += _paths(value, prefix + (index,))
    return found


def _frozen(path: tuple, data: dict) -> bool:
    """Paths left alone: a zoo model's shapes (each new one is a PyTorch export)."""
    model = data.get("model")
    return isinstance(model, dict) and "zoo" in model and path[:2] == ("model", "input_shape")


@st.composite
def mutated(draw: st.DrawFn, text: str) -> bytes:
    """``text`` (a YAML document) with a few structural mutations, then possibly raw YAML or byte damage."""
    data = yaml.safe_load(text)
    for _ in range(draw(st.integers(0, 3))):
        paths = [p for p in _paths(data) if p and not _frozen(p, data)]
        kind = draw(st.sampled_from(["set", "set", "set", "delete", "rename", "add", "wrap"]))
        if kind == "add" or not paths:
            parents = [p for p in _paths(data) if isinstance(_get(data, p), dict)]
            parent = _get(data, draw(st.sampled_from(parents)))
            parent[draw(st.sampled_from(HOSTILE[:30]) | st.text(max_size=10))] = draw(VALUES)
            continue
        path = draw(st.sampled_from(paths))
        container, key = _get(data, path[:-1]), path[-1]
        if kind == "set":
            container[key] = draw(VALUES)
        elif kind == "delete":
            del container[key]
        elif kind == "wrap":
            container[key] = draw(st.sampled_from([[container[key]], {"value": container[key]}, str(container[key])]))
        elif isinstance(container, dict):
            container[draw(st.sampled_from(HOSTILE[:30]) | st.text(max_size=10))] = container.pop(key)
    out = yaml.safe_dump(data, sort_keys=False, allow_unicode=draw(st.booleans()), width=2**20)
    if draw(st.integers(0, 4)) == 0:  # a value replaced by raw YAML
        lines = out.splitlines()
        index = draw(st.integers(0, len(lines) - 1))
        head = lines[index].partition(": ")[0] if ": " in lines[index] else lines[index].rstrip(":")
        lines[index] = f"{head}: {draw(st.sampled_from(RAW_YAML))}"
        out = "\n".join(lines) + "\n"
    raw = out.encode("utf-8", "surrogatepass")
    damage = draw(st.integers(0, 9))
    if damage == 0:  # truncated
        raw = raw[:draw(st.integers(0, len(raw)))]
    elif damage == 1:  # bytes inserted
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    return raw


def _get(data: Any, path: tuple) -> Any:
    for key in path:
        data = data[key]
    return data


@st.composite
def cases(draw: st.DrawFn, jobs: dict[str, str], targets: dict[str, str]) -> Case:
    """A fuzz case from the seeds ``jobs`` and ``targets`` (texts by name)."""
    job = draw(st.sampled_from(sorted(jobs)))
    target = draw(st.sampled_from(sorted(targets)))
    mutate_job, mutate_target = draw(st.sampled_from([(True, False), (False, True), (True, True), (False, False)]))
    return Case(job=draw(mutated(jobs[job])) if mutate_job else jobs[job].encode(),
                target=draw(mutated(targets[target])) if mutate_target else targets[target].encode(),
                command=draw(st.sampled_from(COMMANDS)), target_flag=draw(st.booleans()),
                predictor=draw(st.sampled_from(["roofline"] * 9 + ["default"])),
                existing_output=draw(st.booleans()))


def run_case(case: Case) -> Outcome:
    """Run ``case`` in-process in a fresh folder and check its outcome (:class:`Outcome`)."""
    with tempfile.TemporaryDirectory(prefix="modak-fuzz-") as tmp:
        work = Path(tmp)
        (work / "job.yaml").write_bytes(case.job)
        (work / "target.yaml").write_bytes(case.target)
        for name in ("train.py", "model.py"):  # the training example's script and the network it plans for
            shutil.copy(EXAMPLES / "cnn-train-cpu" / name, work / name)
        write_onnx(work / "tiny.onnx")
        out = work / "out"
        if case.existing_output:
            out.mkdir()
            (out / "Dockerfile").write_text("old\n")
            (out / "keep.txt").write_text("mine\n")
        before = _snapshot(out)
        argv = [case.command, str(work / "job.yaml"), "--predictor", case.predictor]
        argv += ["--target", str(work / "target.yaml")] if case.target_flag else []
        argv += ["-o", str(out)] if case.command == "render" else []
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse
                code = exc.code if isinstance(exc.code, int) else 1
        outcome = Outcome(code, stderr.getvalue())
        if code not in (0, 2):
            outcome.problems.append(f"exit code {code}: {outcome.stderr.strip()[:500]}")
        elif code == 2 and not re.fullmatch(r"modak: error: [^\n]+\n", outcome.stderr):
            outcome.problems.append(f"exit code 2 without one 'modak: error:' line: {outcome.stderr[:500]!r}")
        if case.command == "render":
            if code != 0 and _snapshot(out) != before:
                outcome.problems.append(f"a failed render changed its output folder: {before} -> {_snapshot(out)}")
            if code == 0:
                outcome.problems += check_rendered(out)
        if (work / MARKER).exists():
            outcome.problems.append("the payload ran during modak itself")
        return outcome


def _snapshot(folder: Path) -> dict[str, bytes] | None:
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(folder.rglob("*"))}


# --- checks of a rendered build context -----------------------------------------------------------------------

DOCKERFILE_INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
                           "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
DEF_SHELL_SECTIONS = {"%post", "%environment", "%runscript", "%test", "%startscript", "%setup"}
DEF_SECTIONS = DEF_SHELL_SECTIONS | {"%files", "%labels", "%help", "%arguments"}
# Every external command is a no-op: the scripts run as far as their builtins take them, and an injected
# `echo>PWNED` (a builtin) would leave its file behind.
_NO_COMMANDS = "command_not_found_handle() { return 0; }\n"


def check_rendered(out: Path) -> list[str]:
    """What is wrong with a rendered build context: script syntax, injected code, broken file structure."""
    problems = []
    for name in ("Dockerfile", "Singularity.def", "entrypoint.sh", "job.sh", "plan.json"):
        if not (out / name).is_file():
            problems.append(f"{name} was not written")
    if problems:
        return problems
    json.loads((out / "plan.json").read_text())
    for script in ("entrypoint.sh", "job.sh"):
        syntax = subprocess.run(["bash", "-n", str(out / script)], capture_output=True, text=True)
        if syntax.returncode:
            problems.append(f"{script}: bash -n: {syntax.stderr.strip()[:300]}")
        problems += [f"{script}: {p}" for p in _unquoted_marker((out / script).read_text())]
        problems += _run_script(out / script)
    problems += _check_dockerfile((out / "Dockerfile").read_text())
    problems += _check_definition((out / "Singularity.def").read_text())
    return problems


def _run_script(script: Path) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="modak-fuzz-run-") as tmp:
        (Path(tmp) / "no-commands.sh").write_text(_NO_COMMANDS)
        env = {"PATH": "/nonexistent", "HOME": tmp, "BASH_ENV": str(Path(tmp) / "no-commands.sh")}
        try:
            subprocess.run([shutil.which("bash") or "/bin/bash", str(script)], cwd=tmp, env=env, capture_output=True,
                           timeout=20, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return [f"{script.name}: did not end in 20 s with every command a no-op"]
        return [f"{script.name}: running it executed the payload"] if (Path(tmp) / MARKER).exists() else []


def _unquoted_marker(shell: str) -> list[str]:
    """The marker outside single quotes and comments in shell text (modak quotes values with shlex.quote)."""
    outside, single, double, escaped, comment = [], False, False, False, False
    for index, char in enumerate(shell):
        if comment:
            if char == "\n":
                comment = False
                outside.append(char)
        elif single:
            single = char != "'"
        elif escaped:
            escaped = False
            outside.append(char)
        elif char == "\\":
            escaped = True
        elif char == '"':
            double = not double
        elif char == "'" and not double:
            single = True
        elif char == "#" and not double and (index == 0 or shell[index - 1] in " \t\n"):
            comment = True
        else:
            outside.append(char)  # unquoted or double-quoted: both expand $(...) and `...`
    text = "".join(outside)
    lines = [line for line in text.splitlines() if MARKER in line]
    return [f"payload outside quotes: {line.strip()[:200]!r}" for line in lines]


def _logical_lines(text: str) -> list[str]:
    """Dockerfile lines with their ``\\`` continuations joined."""
    lines, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1]
        else:
            lines.append(current + line)
            current = ""
    return lines + ([current] if current else [])


def _check_dockerfile(text: str) -> list[str]:
    problems = []
    for line in _logical_lines(text):
        instruction, _, rest = line.partition(" ")
        if instruction not in DOCKERFILE_INSTRUCTIONS:
            problems.append(f"Dockerfile: not an instruction: {line[:200]!r}")
        elif instruction in ("CMD", "ENTRYPOINT", "COPY") and rest.startswith("["):
            try:
                json.loads(rest)
            except ValueError:
                problems.append(f"Dockerfile: {instruction} is not a JSON array: {rest[:200]!r}")
        elif instruction == "RUN":
            problems += [f"Dockerfile: {p}" for p in _unquoted_marker(rest)]
            syntax = subprocess.run(["bash", "-n"], input=re.sub(r"--mount=\S+", "", rest), capture_output=True,
                                    text=True)
            if syntax.returncode:
                problems.append(f"Dockerfile: RUN is not shell: {syntax.stderr.strip()[:200]}")
    return problems


def _check_definition(text: str) -> list[str]:
    problems = []
    if "{{" in text or "}}" in text:
        problems.append("Singularity.def: '{{' or '}}' (Apptainer build arguments)")
    section = ""
    for line in text.splitlines():
        if line.startswith("%"):
            section = line.split()[0]
            if section not in DEF_SECTIONS:
                problems.append(f"Singularity.def: unknown section {line[:200]!r}")
        elif not section and line and not line.startswith("#") and line.partition(":")[0] not in ("Bootstrap", "From"):
            problems.append(f"Singularity.def: not a header line: {line[:200]!r}")
        elif section in DEF_SHELL_SECTIONS:
            problems += [f"Singularity.def {section}: {p}" for p in _unquoted_marker(line)]
    return problems

