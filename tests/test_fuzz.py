"""Property-based fuzzing (hypothesis) of the spec loader, the render filters and the command line.

The quick CI profile, derandomized (tests/conftest.py); ``python -m benchmarks.tools.fuzz --cases 10000`` is the long
one. The cases and checks are in ``tests/support/fuzzing.py``.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from modak.errors import InputError
from modak.render.render import def_sh, def_text, dockerfile_sh, dockerfile_str, oneline, sh, word
from modak.spec.loader import parse_yaml
from tests.support.fuzzing import (
    EXAMPLES,
    HOSTILE,
    MARKER,
    PAYLOADS,
    cases,
    check_rendered,
    example_seeds,
    mutated,
    run_case,
)

STRINGS = st.one_of(st.text(), st.sampled_from(HOSTILE), st.text(alphabet="'\"\\$`{}%\n\r\t\x00 !;|&()<>*?[]#~="))
BASH_SAFE = STRINGS.map(lambda s: s.replace("\x00", ""))  # bash cannot hold NUL in a word


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MODAK_DEBUG", raising=False)  # exceptions must become exit codes, as for users
    monkeypatch.delenv("MODAK_TEMPLATES", raising=False)


# --- render filters ---------------------------------------------------------------------------------------------

@given(STRINGS)
def test_sh_is_one_shell_word(value: str) -> None:
    assert shlex.split(sh(value)) == [value]


@given(STRINGS)
def test_dockerfile_filters_stay_on_one_line(value: str) -> None:
    for text in (dockerfile_sh(value), dockerfile_str(value), def_sh(value), def_text(value), oneline(value)):
        assert not any(ord(c) < 0x20 or c == "\x7f" for c in text)
    assert shlex.split(dockerfile_sh(value)) == [oneline(value)]
    quoted = dockerfile_str(value)[1:-1]
    assert dockerfile_str(value)[0] == dockerfile_str(value)[-1] == '"'
    unescaped = quoted.replace("\\\\", "")
    assert '"' not in unescaped.replace('\\"', "") and "$" not in unescaped.replace("\\$", "")


@given(STRINGS)
def test_definition_filters_never_write_build_arguments(value: str) -> None:
    assert shlex.split(def_sh(value)) == [oneline(value)]
    for text in (def_sh(value), def_text(value)):
        assert "{{" not in text and "}}" not in text


@given(STRINGS)
def test_word_refuses_what_is_not_a_word(value: str) -> None:
    try:
        assert shlex.split(word(value)) == [value] and value == shlex.quote(value)
    except ValueError:
        assert value != shlex.quote(value) or not value or any(c in value for c in ",")


def test_sh_round_trips_through_bash() -> None:
    """What bash itself reads: each value printed back unchanged (one bash run for all)."""
    values = [v.replace("\x00", "") for v in HOSTILE] + ["\n\n", "a'b", "'", "\\'"]
    script = "".join(f"printf '%s\\0' {sh(v)}\n" for v in values)
    printed = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    assert printed.decode().split("\0")[:-1] == values


# --- the spec loader --------------------------------------------------------------------------------------------

JOBS, TARGETS = example_seeds(("mnist-cnn-cpu", "cnn-train-cpu"))  # zoo exports of seconds each stay out of CI


@given(st.one_of(st.text(max_size=300), mutated(JOBS["cnn-train-cpu"]).map(lambda b: b.decode("utf-8", "replace"))))
def test_parse_yaml_returns_or_raises_input_error(text: str) -> None:
    try:
        data, lines = parse_yaml(text, Path("job.yaml"))
    except InputError as error:
        assert error.file == "job.yaml" and "\n" not in str(error)
    else:
        assert all(isinstance(line, int) and line >= 1 for line in lines.values())


# --- the command line, in-process ------------------------------------------------------------------------------

@settings(max_examples=300)
@given(cases(JOBS, TARGETS))
def test_cli_ends_in_exit_0_or_2_with_safe_outputs(case) -> None:
    outcome = run_case(case)
    assert not outcome.problems, f"{outcome.problems}\n{case.describe()}"


def test_the_suites_profile_is_deterministic() -> None:
    """Every example the suite runs is derived from the test itself (tests/conftest.py's profile)."""
    assert settings.default.derandomize and settings.default.database is None


def test_checks_can_fail(tmp_path: Path) -> None:
    """The rendered-output checks catch an injected payload, a broken script and a partial folder."""
    for name in ("Dockerfile", "Singularity.def", "plan.json"):
        (tmp_path / name).write_text("{}" if name == "plan.json" else "FROM x\n")
    (tmp_path / "entrypoint.sh").write_text(f"set -- python3 $(echo>{MARKER})\n")
    (tmp_path / "job.sh").write_text("if then\n")
    problems = "\n".join(check_rendered(tmp_path))
    assert "entrypoint.sh: payload outside quotes" in problems and "entrypoint.sh: running it executed" in problems
    assert "job.sh: bash -n" in problems
    (tmp_path / "Dockerfile").write_text(f"FROM x\nRUN echo 'a'\necho>{MARKER}\n")
    assert any("not an instruction" in p for p in check_rendered(tmp_path))
    (tmp_path / "job.sh").unlink()
    assert check_rendered(tmp_path) == ["job.sh was not written"]


# --- the command line as users run it --------------------------------------------------------------------------

def modak(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modak", *args], capture_output=True, text=True, timeout=300)


def test_cli_hostile_command_is_quoted_in_every_output(tmp_path: Path) -> None:
    job = yaml.safe_load((EXAMPLES / "cnn-train-cpu" / "job.yaml").read_text())
    job["entrypoint"]["command"] = ["python3", "train.py", *[p.replace("\x00", "") for p in PAYLOADS]]
    job["target"] = str(EXAMPLES / "resnet50-train-gpu" / "target.yaml")  # Slurm and Apptainer
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "train.py").write_text("print('hi')\n")
    shutil.copy(EXAMPLES / "cnn-train-cpu" / "model.py", tmp_path / "model.py")
    result = modak("render", str(tmp_path / "job.yaml"), "--predictor", "roofline", "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert check_rendered(tmp_path / "out") == []
    assert "echo>PWNED" in (tmp_path / "out" / "entrypoint.sh").read_text()  # it is there, quoted


def test_cli_hostile_name_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    job = (EXAMPLES / "mnist-cnn-cpu" / "job.yaml").read_text().replace("name: mnist-cnn", 'name: "x\\n$(echo>PWNED)"')
    (tmp_path / "job.yaml").write_text(job.replace("target: target.yaml",
                                                   f"target: {EXAMPLES / 'mnist-cnn-cpu'}/target.yaml"))
    result = modak("render", str(tmp_path / "job.yaml"), "-o", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"modak: error: {tmp_path / 'job.yaml'}:4: name: invalid value 'x\\n$(echo>PWNED)'")
    assert not (tmp_path / "out").exists() and not (tmp_path / MARKER).exists()
