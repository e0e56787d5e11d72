"""``modak run`` (:mod:`modak.runtime.batch`) as the image runs it: the command in a subprocess started through the
launcher, on tiny ONNX models with ONNX Runtime, against ONNX Runtime run directly on the same inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from modak.image.deployment import Deployment
from modak.workload.zoo import export_onnx

BATCH = 4


def _plan(folder: Path, model: Path, input_shapes: dict[str, list[int]], zoo: str | None) -> dict[str, str]:
    """The environment that runs ``model`` as a deployment (ONNX Runtime, CPU, one thread) planned in ``folder``."""
    deployment = Deployment(runtime="onnxruntime", device="cpu", precision="fp32", task="inference",
                            params={"threads": 1}, env={}, batch_size=BATCH, input_shapes=input_shapes, zoo=zoo)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps({"deployment": deployment.to_dict()}))
    return {**os.environ, "MODAK_PLAN": str(folder / "plan.json"), "MODAK_MODEL": str(model),
            "MODAK_WORKDIR": str(folder)}


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> dict[str, str]:
    return _plan(tmp_path_factory.mktemp("mlp"), export_onnx("mlp"), {"input": [784]}, "mlp")


def command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "modak.image.launch", "--", sys.executable, "-m", "modak.runtime", "run",
            *map(str, args)]


def modak_run(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), env=env, capture_output=True, text=True, timeout=120)


def summary_of(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


def reference(env: dict[str, str], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(env["MODAK_MODEL"], providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {k: v.astype(np.float32) for k, v in feeds.items()})))


def samples(rng: np.random.Generator, *shape: int, dtype: str = "float32") -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def assert_matches(env: dict[str, str], output: Path, feeds: dict[str, np.ndarray], batched: bool = True) -> None:
    if not batched:
        feeds = {k: v[np.newaxis] for k, v in feeds.items()}
    with np.load(output, allow_pickle=False) as got:
        expected = reference(env, feeds)
        assert sorted(got.files) == sorted(expected)
        for name, want in expected.items():
            assert got[name].shape == (want.shape if batched else want.shape[1:])
            np.testing.assert_allclose(got[name], want if batched else want[0], rtol=1e-4, atol=1e-5)


def outputs_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_folder_of_files_with_varied_sample_counts(mlp, tmp_path):
    rng = np.random.default_rng(0)
    data, out = tmp_path / "in", tmp_path / "out" / "nested"
    data.mkdir()
    feeds = {"a": samples(rng, 1, 784), "b": samples(rng, 3, 784, dtype="float64"), "c": samples(rng, 9, 784),
             "d": samples(rng, 784), "e": samples(rng, 3, 784)}
    np.save(data / "a.npy", feeds["a"])
    np.save(data / "b.npy", feeds["b"])  # float64: converted to the model's float32
    np.savez(data / "c.npz", input=feeds["c"])
    np.save(data / "d.npy", feeds["d"])  # no sample dimension: one sample, outputs without one either
    np.savez_compressed(data / "e.npz", input=feeds["e"])
    (data / "notes.txt").write_text("not an input")
    (data / "sub").mkdir()  # not searched
    np.save(data / "sub" / "f.npy", feeds["a"])

    done = modak_run(mlp, "--input", data, "--output", out, "--json")
    assert done.returncode == 0, done.stderr
    summary = summary_of(done)
    assert (summary["status"], summary["items"], summary["done"], summary["skipped"], summary["failed"]) == (
        "ok", 5, 5, 0, 0)
    assert summary["samples"] == 1 + 3 + 9 + 1 + 3 and summary["samples_per_s"] > 0
    assert "5 done, 0 skipped, 0 failed of 5 items" in done.stderr
    assert "sample" in done.stderr.split("modak run:")[0]  # the progress bar, before the summary line
    assert outputs_in(out) == ["a.npz", "b.npz", "c.npz", "d.npz", "e.npz"]
    for name, feed in feeds.items():
        assert_matches(mlp, out / f"{name}.npz", {"input": feed}, batched=name != "d")


def test_one_archive_and_npy_format(mlp, tmp_path):
    rng = np.random.default_rng(1)
    feed = samples(rng, 6, 784)
    np.savez(tmp_path / "batch.npz", input=feed)

    done = modak_run(mlp, "--input", tmp_path / "batch.npz", "--output", tmp_path / "out", "--quiet")
    assert done.returncode == 0, done.stderr
    assert outputs_in(tmp_path / "out") == ["batch.npz"]
    assert_matches(mlp, tmp_path / "out" / "batch.npz", {"input": feed})
    assert "sample/s]" not in done.stderr  # --quiet: no bar, the summary line only
    assert "1 done, 0 skipped, 0 failed of 1 items" in done.stderr

    done = modak_run(mlp, "--input", tmp_path / "batch.npz", "--output", tmp_path / "npy", "--format", "npy", "-q")
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(np.load(tmp_path / "npy" / "batch.npy", allow_pickle=False),
                               reference(mlp, {"input": feed})["output"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_interrupted_run_resumes_without_partial_or_repeated_outputs(mlp, tmp_path):
    rng = np.random.default_rng(2)
    data, out = tmp_path / "in", tmp_path / "out"
    data.mkdir()
    count = 1500
    feeds = {f"{i:04d}": samples(rng, 1 + i % 3, 784) for i in range(count)}
    for name, feed in feeds.items():
        np.save(data / f"{name}.npy", feed)

    process = subprocess.Popen(command("--input", data, "--output", out, "--json", "-q"), env=mlp,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out.is_dir() and any(p.suffix == ".npz" for p in out.iterdir())):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.002)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    first = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert all(name.endswith(".npz") and not name.startswith(".") for name in first), first  # no temp file left
    assert 0 < len(first) < count, "the run ended before the signal: make it longer"
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert (summary["status"], summary["done"], summary["skipped"]) == ("interrupted", len(first), 0)
    for name in sorted(first)[::50]:  # each written output is complete and right
        assert_matches(mlp, out / name, {"input": feeds[name[:-4]]})

    time.sleep(0.01)  # a rewritten file would show a later mtime
    done = modak_run(mlp, "--input", data, "--output", out, "--json", "-q")
    assert done.returncode == 0, done.stderr
    summary = summary_of(done)
    assert (summary["done"], summary["skipped"], summary["failed"]) == (count - len(first), len(first), 0)
    assert outputs_in(out) == sorted(f"{name}.npz" for name in feeds)
    assert {name: (out / name).stat().st_mtime_ns for name in first} == first
    for name in sorted(feeds)[::97]:
        assert_matches(mlp, out / f"{name}.npz", {"input": feeds[name]})


def test_bad_arguments_exit_2_with_one_message(mlp, tmp_path):
    done = modak_run(mlp, "--input", tmp_path / "missing", "--output", tmp_path / "out")
    assert done.returncode == 2 and "missing: no such file or folder" in done.stderr
    assert "Traceback" not in done.stderr
    (tmp_path / "empty").mkdir()
    done = modak_run(mlp, "--input", tmp_path / "empty", "--output", tmp_path / "out", "--json")
    assert done.returncode == 2 and "no .npy or .npz files" in done.stderr
    assert summary_of(done)["status"] == "error"
    np.save(tmp_path / "empty" / "a.npy", np.zeros((1, 784), "float32"))
    (tmp_path / "file").write_text("")
    done = modak_run(mlp, "--input", tmp_path / "empty", "--output", tmp_path / "file")
    assert done.returncode == 2 and "not a folder" in done.stderr and "Traceback" not in done.stderr
    done = modak_run(mlp, "--input", tmp_path / "empty", "--output", tmp_path / "empty")
    assert done.returncode == 2 and "must not be the folder of the inputs" in done.stderr


def _bad_inputs(folder: Path) -> None:
    rng = np.random.default_rng(3)
    folder.mkdir()
    np.save(folder / "a.npy", samples(rng, 2, 784))
    np.save(folder / "b_shape.npy", samples(rng, 2, 100))
    np.save(folder / "c.npy", samples(rng, 3, 784))


def test_bad_file_stops_with_exit_2_naming_it(mlp, tmp_path):
    _bad_inputs(tmp_path / "in")
    done = modak_run(mlp, "--input", tmp_path / "in", "--output", tmp_path / "out", "--json")
    assert done.returncode == 2, done.stderr
    assert "b_shape.npy" in done.stderr and "784" in done.stderr and "Traceback" not in done.stderr
    assert outputs_in(tmp_path / "out") == ["a.npz"]  # read before the bad file: finished; after it: not started
    summary = summary_of(done)
    assert summary["status"] == "stopped" and summary["failures"][0]["file"].endswith("b_shape.npy")


def test_keep_going_records_bad_files_and_exits_4(mlp, tmp_path):
    data = tmp_path / "in"
    _bad_inputs(data)
    objects = np.empty(2, dtype=object)
    objects[:] = [{"x": 1}, [2]]
    np.save(data / "d_pickled.npy", objects, allow_pickle=True)
    np.savez(data / "e_pickled.npz", input=objects)
    np.savez(data / "f_names.npz", pixels=np.zeros((1, 784), "float32"))
    (data / "g_text.npy").write_text("not numpy")
    np.save(data / "h_large.npy", np.zeros((400, 784), "float32"))  # 1.2 MB
    np.save(data / "i_dtype.npy", np.array(["x"] * 784)[np.newaxis])
    np.save(data / "j.npy", np.ones(784, "float32"))

    done = modak_run(mlp, "--input", data, "--output", tmp_path / "out", "--keep-going", "--max-file-mb", "1",
                     "--json")
    assert done.returncode == 4, done.stderr
    assert outputs_in(tmp_path / "out") == ["a.npz", "c.npz", "j.npz"]
    assert_matches(mlp, tmp_path / "out" / "c.npz", {"input": np.load(data / "c.npy")})
    summary = summary_of(done)
    errors = {Path(f["file"]).name: f["error"] for f in summary["failures"]}
    assert (summary["status"], summary["done"], summary["failed"]) == ("failed", 3, 7)
    assert "pickled" in errors["d_pickled.npy"] and "pickled" in errors["e_pickled.npz"]
    assert "missing input" in errors["f_names.npz"] and "unknown pixels" in errors["f_names.npz"]
    assert "not a NumPy" in errors["g_text.npy"]
    assert "--max-file-mb" in errors["h_large.npy"]
    assert "dtype" in errors["i_dtype.npy"] and "shape" in errors["b_shape.npy"]
    for name in errors:
        assert name in done.stderr
    assert "Traceback" not in done.stderr


def test_model_with_two_inputs_reads_archives_by_input_name(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["sum"]), helper.make_node("Mul", ["x", "y"], ["product"])], "two",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 3]) for n in ("x", "y")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 3]) for n in ("sum", "product")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "two.onnx")
    env = _plan(tmp_path / "plan", tmp_path / "two.onnx", {"x": [3], "y": [3]}, None)
    rng = np.random.default_rng(4)
    data = tmp_path / "in"
    data.mkdir()
    feeds = {"a": {"x": samples(rng, 5, 3), "y": samples(rng, 5, 3)}, "b": {"x": samples(rng, 3), "y": samples(rng, 3)}}
    for name, feed in feeds.items():
        np.savez(data / f"{name}.npz", **feed)
    np.save(data / "c.npy", samples(rng, 2, 3))

    done = modak_run(env, "--input", data, "--output", tmp_path / "out", "--keep-going", "--json", "-q")
    assert done.returncode == 4, done.stderr
    assert "c.npy" in done.stderr and "2 inputs (x, y)" in done.stderr
    assert outputs_in(tmp_path / "out") == ["a.npz", "b.npz"]
    assert_matches(env, tmp_path / "out" / "a.npz", feeds["a"])
    assert_matches(env, tmp_path / "out" / "b.npz", feeds["b"], batched=False)
    done = modak_run(env, "--input", data / "a.npz", "--output", tmp_path / "npy", "--format", "npy")
    assert done.returncode == 2 and "single-output" in done.stderr


def test_model_that_cannot_load_exits_3(tmp_path):
    env = _plan(tmp_path / "plan", tmp_path / "missing.onnx", {"input": [784]}, None)
    np.save(tmp_path / "a.npy", np.zeros((1, 784), "float32"))
    done = modak_run(env, "--input", tmp_path / "a.npy", "--output", tmp_path / "out", "--json")
    assert done.returncode == 3, done.stderr
    assert "cannot load the model" in done.stderr and "Traceback" not in done.stderr
    assert summary_of(done)["status"] == "error" and outputs_in(tmp_path / "out") == []
