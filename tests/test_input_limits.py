"""Bounded input (modak.limits): every hostile input file ends quickly as one located line, exit code 2."""

from __future__ import annotations

import csv
import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from modak import api, limits
from modak.cli import main
from modak.errors import InputError
from modak.measurements.store import COLUMNS, read_csv
from modak.spec.loader import load_job, parse_yaml
from modak.workload import analysis
from modak.workload.source import resolve_model
from tests.support.onnx_graphs import write_onnx

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "examples" / "mnist-cnn-cpu" / "target.yaml"
HEADER = "apiVersion: modak/v1\nkind: Job\nname: x\ntask: inference\n"
# Nine references to the previous anchor on each of nine levels: 9**9 strings once expanded (1 KB of YAML).
BILLION_LAUGHS = HEADER + 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))


def parse_error(text: str) -> InputError:
    with pytest.raises(InputError) as info:
        parse_yaml(text, Path("job.yaml"))
    return info.value


def modak(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modak", *args], capture_output=True, text=True, timeout=120)


def test_alias_bomb_is_refused_while_counting() -> None:
    start = time.perf_counter()
    error = parse_error(BILLION_LAUGHS)
    assert time.perf_counter() - start < 2
    assert error.file == "job.yaml" and error.line is not None and error.field.startswith("a")
    assert f"more than {limits.MAX_YAML_NODES:,} YAML nodes, aliases expanded" in error.message


def test_alias_use_within_the_budget_loads() -> None:
    data, lines = parse_yaml("a: &a [1, 2]\nb: *a\nc: *a\n", Path("job.yaml"))
    assert data == {"a": [1, 2], "b": [1, 2], "c": [1, 2]} and lines[("c", 1)] == 1


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "".join(f"{'  ' * i}a:\n" for i in range(3000)),
                                  "- " * 3000 + "x", "{a: " * 5000 + "1" + "}" * 5000],
                         ids=["flow-list", "block-mapping", "block-list", "flow-mapping"])
def test_deep_nesting_is_refused_before_python_recursion(text: str) -> None:
    error = parse_error(text)
    assert f"nested deeper than {limits.MAX_YAML_DEPTH} levels" in error.message
    assert error.line in (1, limits.MAX_YAML_DEPTH + 1)  # where the first level too deep starts


def test_depth_counts_expanded_aliases() -> None:
    chain = "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 100))
    error = parse_error("a0: &a0 [x]\n" + chain)
    assert f"nested deeper than {limits.MAX_YAML_DEPTH} levels, aliases expanded" in error.message


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a\n  b: *a\n"])
def test_recursive_alias_is_refused(text: str) -> None:
    assert "an alias refers to a node that contains it" in parse_error(text).message


def test_complex_key_is_refused() -> None:
    error = parse_error("name: x\n? [a, b]\n: 1\n")
    assert error.line == 2 and "a key must be a plain value" in error.message


def test_long_string_names_line_and_field() -> None:
    error = parse_error("name: x\nmodel:\n  onnx: " + "a" * (limits.MAX_STRING_CHARS + 1) + "\n")
    assert (error.line, error.field) == (3, "model.onnx") and "more than the limit of 65,536" in error.message


def test_expanded_text_is_bounded() -> None:
    big = "b" * limits.MAX_STRING_CHARS
    error = parse_error(f"a: &s {big}\nlist: [{', '.join(['*s'] * 20)}]\n")
    assert error.field.startswith("list.") and "characters of strings, aliases expanded" in error.message


def test_unsafe_tag_is_an_input_error(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(HEADER + "target: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(InputError, match="could not determine a constructor"):
        load_job(job)


def test_large_and_binary_files_are_located_errors(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(HEADER + "# " + "x" * limits.MAX_SPEC_BYTES + "\n")
    with pytest.raises(InputError, match=f"^{big}: a YAML spec file is larger than the limit of 1,048,576 bytes"):
        load_job(big)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(HEADER.encode() + b"name: \xff\xfe\n")
    with pytest.raises(InputError, match=f"^{binary}:5: not UTF-8 text"):
        load_job(binary)


def test_cli_hostile_specs_exit_2_quickly(tmp_path: Path) -> None:
    """What a user sees: one line and exit code 2, in seconds, with bounded memory."""
    files = {"bomb.yaml": BILLION_LAUGHS, "deep.yaml": "[" * 100_000 + "]" * 100_000,
             "tag.yaml": HEADER + "name: !!python/name:os.system ''\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        start = time.perf_counter()
        result = modak("plan", str(tmp_path / name), "--target", str(TARGET))
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"modak: error: {tmp_path / name}:") and result.stderr.count("\n") == 1
        assert time.perf_counter() - start < 30


# --- ONNX models -----------------------------------------------------------------------------------------------

def onnx_job(folder: Path, model: str) -> Path:
    job = folder / "job.yaml"
    job.write_text(HEADER + f"target: {TARGET}\nmodel:\n  onnx: {model}\n  input_shape: [4]\n")
    return job


def test_truncated_onnx_names_the_file(tmp_path: Path) -> None:
    write_onnx(tmp_path / "tiny.onnx")
    (tmp_path / "cut.onnx").write_bytes((tmp_path / "tiny.onnx").read_bytes()[:60])
    result = modak("plan", str(onnx_job(tmp_path, "cut.onnx")), "--predictor", "roofline")
    assert result.returncode == 2
    assert result.stderr.startswith(f"modak: error: {tmp_path / 'job.yaml'}:7: model.onnx: {tmp_path / 'cut.onnx'}: "
                                    "not a valid ONNX model")


def test_onnx_size_and_node_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tiny.onnx"
    write_onnx(path)
    assert len(analysis.load_model(path).graph.node) == 2
    monkeypatch.setattr(analysis, "MAX_ONNX_NODES", 1)
    with pytest.raises(InputError, match=f"^{path}: the graph has more than 1 nodes"):
        analysis.load_model(path)
    monkeypatch.setattr(analysis, "MAX_ONNX_BYTES", 10)
    with pytest.raises(InputError, match=f"^{path}: the ONNX file is [0-9,]+ bytes, more than the limit of 10 bytes"):
        analysis.load_model(path)


def nested_functions(levels: int, fanout: int, recursive: bool = False) -> object:
    """f0 is one Relu; f<i> calls f<i-1> ``fanout`` times: 10 nodes on disk, fanout**levels once inlined."""
    functions = [helper.make_function("local", "f0", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])],
                                      [helper.make_opsetid("", 17)])]
    for i in range(1, levels + 1):
        callee = f"f{levels if recursive else i - 1}"
        nodes = [helper.make_node(callee, [f"t{j}"], [f"t{j + 1}"], domain="local") for j in range(fanout)]
        nodes[0].input[0], nodes[-1].output[0] = "x", "y"
        functions.append(helper.make_function("local", f"f{i}", ["x"], ["y"], nodes,
                                              [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]))
    graph = helper.make_graph([helper.make_node(f"f{levels}", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    return helper.make_model(graph, functions=functions,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])


def test_function_inlining_bomb_is_refused_without_inlining() -> None:
    analysis.check_node_count(nested_functions(3, 10))  # 1,000 nodes inlined: fine
    with pytest.raises(InputError, match="more than 100,000 nodes \\(local functions inlined\\)"):
        analysis.check_node_count(nested_functions(9, 10))  # 10**9 nodes inlined
    with pytest.raises(InputError, match="a local function calls itself"):
        analysis.check_node_count(nested_functions(2, 2, recursive=True))


# --- measurement CSV files and the SQLite store -----------------------------------------------------------------

def test_csv_errors_name_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("machine,model\nbox,mnist\n")
    with pytest.raises(InputError, match=f"^{path}:1: missing columns"):
        list(read_csv(path))
    row = {column: "1" for column in COLUMNS} | {"batch_size": "many"}
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        writer.writerow(row)
    with pytest.raises(InputError, match=f"^{path}:2: batch_size: expected an integer, got 'many'"):
        list(read_csv(path))
    path.write_text(",".join(COLUMNS) + "\n" + "x" * 200_000 + "\n")
    with pytest.raises(InputError, match=f"^{path}:2: not a CSV file of measurements: field larger than"):
        list(read_csv(path))


def test_csv_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import modak.measurements.store as store

    path = tmp_path / "rows.csv"
    path.write_text(",".join(COLUMNS) + "\n")
    assert list(read_csv(path)) == []
    monkeypatch.setattr(store, "MAX_CSV_BYTES", 10)
    with pytest.raises(InputError, match=f"^{path}: the CSV file is [0-9,]+ bytes, more than the limit of 10 bytes"):
        list(read_csv(path))


# --- regressions found by the fuzzer (tests/test_fuzz.py) --------------------------------------------------------

def test_unknown_key_with_brackets_is_located(tmp_path: Path) -> None:
    """A key with brackets, like the markers in a validator's error paths ('list[...]', '[...]'), was dropped from
    the error location: IndexError."""
    job = tmp_path / "job.yaml"
    job.write_text(HEADER + f"target: {TARGET}\nmodel: {{zoo: mnist_cnn, input_shape: [x]}}\n'a[b]': 1\n")
    with pytest.raises(InputError) as info:
        load_job(job)
    assert (info.value.line, info.value.field) == (7, "a[b]") and info.value.message.startswith("unknown field")


def test_unprintable_character_is_a_located_syntax_error(tmp_path: Path) -> None:
    """PyYAML checks characters when the loader is made, which was outside the syntax-error handling: exit 1."""
    job = tmp_path / "job.yaml"
    job.write_text(HEADER + "target: a\x05b\n")
    with pytest.raises(InputError, match=f"^{job}:5: YAML syntax error: character U\\+0005 is not allowed$"):
        load_job(job)


def test_error_with_a_newline_in_a_value_stays_one_line(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text('apiVersion: modak/v1\nkind: "Job\\nfake: line"\n')
    assert str(parse_error_of(job)) == f"{job}:2: kind: expected kind 'Job', got 'Job\\nfake: line'"


def parse_error_of(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        load_job(path)
    return info.value


@pytest.mark.parametrize("field", ["target", "model.onnx", "entrypoint.command.0"])
def test_nul_in_a_path_or_argument_is_an_input_error(tmp_path: Path, field: str) -> None:
    """A NUL in a path made Path.is_file() raise ValueError (exit 1); none can reach a file system or exec."""
    values = {"target": "a\\0b", "model.onnx": "m\\0.onnx", "entrypoint.command.0": "py\\0thon"}
    job = tmp_path / "job.yaml"
    target = f'"{values["target"]}"' if field == "target" else str(TARGET)
    model = f'{{onnx: "{values["model.onnx"]}"}}' if field == "model.onnx" else "{zoo: mnist_cnn}"
    command = f'["{values["entrypoint.command.0"]}"]' if field == "entrypoint.command.0" else "[python3]"
    job.write_text(HEADER + f"target: {target}\nmodel: {model}\nentrypoint: {{command: {command}}}\n")
    with pytest.raises(InputError) as info:
        load_job(job)
    assert info.value.field == field and "cannot contain the NUL character" in info.value.message


@pytest.mark.parametrize("text", ["apiVersion: !!float", "a: !!int ''", "a: !!timestamp 2026-13-45"])
def test_a_tagged_value_its_tag_cannot_read_is_an_input_error(text: str) -> None:
    """PyYAML's constructors raise IndexError/ValueError for these (found by the fuzzer: `apiVersion: !!float`)."""
    assert parse_error(text).message.startswith("YAML error")


def test_application_files_beyond_the_limit_are_refused_at_their_entry(tmp_path: Path, monkeypatch) -> None:
    """`entrypoint.files: [..]` would copy a whole tree into the build context: bounded by size and count."""
    from modak.spec import resolve

    monkeypatch.setattr(resolve, "MAX_APP_FILES", 5)
    (tmp_path / "app").mkdir()
    for index in range(6):
        (tmp_path / "app" / f"f{index}.py").write_text("print(1)\n")
    (tmp_path / "serve.py").write_text("print(1)\n")
    job = tmp_path / "job.yaml"
    job.write_text(HEADER + f"target: {TARGET}\nmodel: {{zoo: mnist_cnn, input_shape: [1, 28, 28]}}\n"
                   "entrypoint: {command: [python3, serve.py], files: [serve.py, app]}\n")
    with pytest.raises(InputError) as info:
        api.load(job)
    assert info.value.field == "entrypoint.files.1" and "more than 5 files" in info.value.message


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "{" * 10])
def test_check_json_files_are_bounded_and_never_crash(tmp_path: Path, text: str) -> None:
    from modak.integrations.check import _read_json

    path = tmp_path / "baseline.json"
    path.write_text(text)
    with pytest.raises(InputError):
        _read_json(path)


# ---- paths the operating system refuses ------------------------------------------------------------------------

SPEC_TARGET = ("apiVersion: modak/v1\nkind: Target\nname: t\n"
               "cpu: {microarchitecture: zen3, sockets: 1, cores_per_socket: 2}\nmemory: {size_gb: 8}\n")
# Each path field of a job or target, as the YAML that sets it to VALUE (relative paths: resolved against the file).
PATH_FIELDS = {
    "target": ("job", "target: VALUE\nmodel: {zoo: mnist_cnn}\n"),
    "model.onnx": ("job", "target: target.yaml\nmodel: {onnx: VALUE}\n"),
    "entrypoint.files.0": ("job", "target: target.yaml\nmodel: {zoo: mnist_cnn}\n"
                                  "entrypoint: {command: [python3], files: [VALUE]}\n"),
    "calibration.data": ("job", "target: target.yaml\nmodel: {zoo: mnist_cnn}\ncalibration: {data: VALUE}\n"),
    "data.location": ("job", "target: target.yaml\nmodel: {zoo: mnist_cnn}\ndata: {location: VALUE}\n"),
    "data.output": ("job", "target: target.yaml\nmodel: {zoo: mnist_cnn}\ndata: {location: /data, output: VALUE}\n"),
    "python.ca_bundle": ("target", "python: {ca_bundle: VALUE}\n"),
    "python.wheelhouse": ("target", "python: {wheelhouse: VALUE}\n"),
    "container.templates": ("target", "container: {templates: VALUE}\n"),
}
REFUSED = {  # a path the operating system refuses, made in the folder given, and why
    "a name too long": (lambda folder: "x" * 308, errno.ENAMETOOLONG),
    "a path too long": (lambda folder: "/".join(["d" * 200] * 30), errno.ENAMETOOLONG),
    "a loop of links": (lambda folder: _link_loop(folder) + "/file", errno.ELOOP),
}


def _link_loop(folder: Path) -> str:
    (folder / "loop-a").symlink_to("loop-b")
    (folder / "loop-b").symlink_to("loop-a")
    return "loop-a"


def _path_case(folder: Path, field: str, value: str) -> Path:
    """A job (and its target) in ``folder`` whose ``field`` is ``value``; the job file."""
    where, text = PATH_FIELDS[field]
    target = SPEC_TARGET + (text.replace("VALUE", value) if where == "target" else "")
    job = HEADER + (text.replace("VALUE", value) if where == "job" else PATH_FIELDS["model.onnx"][1].replace(
        "VALUE", "tiny.onnx"))
    (folder / "target.yaml").write_text(target)
    write_onnx(folder / "tiny.onnx")
    (folder / "job.yaml").write_text(job)
    return folder / "job.yaml"


@pytest.mark.parametrize("refused", REFUSED)
@pytest.mark.parametrize("field", PATH_FIELDS)
def test_a_path_the_os_refuses_in_a_spec_is_a_located_input_error(tmp_path: Path, field: str, refused: str) -> None:
    """A 308-character `target:` ended in exit 1 (OSError: File name too long; found by the fuzzer): every path
    field says where it is and why the operating system refuses it."""
    make, code = REFUSED[refused]
    job = _path_case(tmp_path, field, make(tmp_path))
    with pytest.raises(InputError) as info:
        resolve_model(load_job(job))
    spec = tmp_path / ("target.yaml" if PATH_FIELDS[field][0] == "target" else "job.yaml")
    assert (info.value.file, info.value.field) == (str(spec), field) and info.value.line is not None
    assert info.value.message == f"cannot use this path: {os.strerror(code)}"


@pytest.mark.parametrize("argv, field", [
    (["plan", "PATH"], "job"), (["plan", "JOB", "--target", "PATH"], "target"),
    (["plan", "JOB", "--store", "PATH"], "store"),
    (["render", "JOB", "-o", "PATH"], "output"), (["check", "JOB", "--baseline", "PATH"], "baseline"),
    (["whatif", "JOB", "--targets", "TARGET", "PATH"], "targets"),
])
@pytest.mark.parametrize("refused", REFUSED)
def test_a_path_argument_the_os_refuses_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          argv: list[str], field: str, refused: str) -> None:
    make, code = REFUSED[refused]
    job = _path_case(tmp_path, "target", "target.yaml")
    path = str(tmp_path / make(tmp_path))
    values = {"PATH": path, "JOB": str(job), "TARGET": str(tmp_path / "target.yaml")}
    assert main([values.get(a, a) for a in argv]) == 2
    assert capsys.readouterr().err == f"modak: error: {path}: {field}: cannot use this path: {os.strerror(code)}\n"


def test_a_path_without_permission_is_an_input_error(tmp_path: Path) -> None:
    """As root, without the capabilities that bypass file permissions (else as this user): a spec's path and a
    path argument inside a folder nobody may enter."""
    _path_case(tmp_path, "target", "closed/target.yaml")
    (tmp_path / "closed").mkdir(mode=0)
    without = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
               "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    try:
        spec = subprocess.run([*without, sys.executable, "-m", "modak", "plan", str(tmp_path / "job.yaml")],
                              capture_output=True, text=True, timeout=120)
        argument = subprocess.run([*without, sys.executable, "-m", "modak", "render", str(tmp_path / "job.yaml"),
                                   "--target", str(tmp_path / "target.yaml"), "-o", str(tmp_path / "closed" / "out")],
                                  capture_output=True, text=True, timeout=120)
    finally:
        (tmp_path / "closed").chmod(0o755)
    denied = os.strerror(errno.EACCES)
    assert (spec.returncode, spec.stderr) == (2, f"modak: error: {tmp_path / 'job.yaml'}:5: target: cannot use this "
                                                 f"path: {denied}\n")
    assert (argument.returncode, argument.stderr) == (2, f"modak: error: {tmp_path / 'closed' / 'out'}: output: "
                                                         f"cannot use this path: {denied}\n")
