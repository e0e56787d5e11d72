"""``modak build`` and ``modak submit`` for real: images built by Podman's Docker-compatible service from the
rendered contexts, smoke-run, pushed to a local registry and run by a single-node Slurm.

What the tests need is what ``.ci/provision.sh`` sets up (and CI runs it first): the Podman service
(``DOCKER_HOST``, default ``unix:///run/modak/podman.sock``), the local base image
``localhost/debian-base:bookworm``, ``docker-registry`` on 127.0.0.1:5000, a second one that requires a login on
127.0.0.1:5001 and Slurm with partition ``debug``.
A missing service is a failure with the command that starts it, never a skip. The SIF builds are in
``tests/test_apptainer.py``.

The first build of each image is the expensive part (package downloads); the images are built once per session
and shared. Later sessions reuse the engine's layer cache.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from modak.build.credentials import split_ref
from modak.build.engines import BuildLog, DockerEngine, Step, parse_self_test
from modak.build.pipeline import LOCK_LABEL, OUT_DIR_LOCK, out_dir_lock, tuned_artifacts
from modak.build.submit import Submission, wait
from modak.errors import (
    EXIT_BAD_INPUT,
    EXIT_BUILD_FAILED,
    EXIT_ENGINE_UNAVAILABLE,
    EXIT_INTERRUPTED,
    EXIT_PUSH_FAILED,
    EngineUnavailable,
    SubmitFailed,
)
from modak.schedulers import scheduler
from tests.support.onnx_graphs import write_onnx
from tests.support.signals import sigint_default
from tests.support.specs import MIXER_MODULE

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mnist-cnn-cpu"
BASE_IMAGE = "localhost/debian-base:bookworm"
REGISTRY = "127.0.0.1:5000"
HOSTILE = ["$(touch /tmp/PWNED)", "`touch /tmp/PWNED`", "; touch /tmp/PWNED", "it's \"quoted\"", "two\nlines",
           "{{ 7*7 }}", "{% raw %}x{% endraw %}", "back\\slash", "${HOME}", "From: evil %post", "--help"]


# --- helpers -------------------------------------------------------------------------------------------------

def modak(*args: str | Path, env: dict[str, str] | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    """The real CLI in a fresh process."""
    return subprocess.run([sys.executable, "-m", "modak", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, cwd=ROOT)


def build(*args: str | Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``modak build ... --json``, which must succeed; its JSON."""
    result = modak("build", *args, "--json", env=env)
    assert result.returncode == 0, f"modak build failed ({result.returncode}): {result.stderr[-3000:]}"
    return json.loads(result.stdout)


def write_target(folder: Path, name: str, **changes: Any) -> Path:
    """The CNN example's target (local CPU, local base image, host CA bundle) with top-level changes."""
    target = yaml.safe_load((EXAMPLE / "target.yaml").read_text())
    target["name"] = name
    for key, value in changes.items():
        target[key] = {**target.get(key, {}), **value} if isinstance(value, dict) else value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "target.yaml"
    path.write_text(yaml.safe_dump(target, sort_keys=False))
    return path


def write_job(folder: Path, **changes: Any) -> Path:
    """The CNN example's job, pointing at ``folder/target.yaml``, with top-level changes."""
    job = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    job.update(changes, target="target.yaml")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def image_labels(engine: DockerEngine, ref: str) -> dict[str, str]:
    info = engine.inspect(ref)
    assert info is not None, f"no image {ref}"
    return dict(info.labels)


def registry_labels(ref: str, login: tuple[str, str] | None = None) -> dict[str, str]:
    """The labels of ``ref`` as the registry stores them (manifest -> config blob), over its HTTP API (with basic
    auth as ``login``: user, password)."""
    repository, tag = split_ref(ref)
    host, _, name = repository.partition("/")
    auth = {"Authorization": "Basic " + base64.b64encode(":".join(login).encode()).decode()} if login else {}
    accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
    request = urllib.request.Request(f"http://{host}/v2/{name}/manifests/{tag}", headers={"Accept": accept, **auth})
    with urllib.request.urlopen(request, timeout=30) as response:
        manifest = json.load(response)
    request = urllib.request.Request(f"http://{host}/v2/{name}/blobs/{manifest['config']['digest']}", headers=auth)
    with urllib.request.urlopen(request, timeout=30) as blob:
        config = json.load(blob)
    return config.get("config", {}).get("Labels") or {}


@dataclass(frozen=True)
class Built:
    job: Path
    out: Path
    data: dict[str, Any]

    @property
    def ref(self) -> str:
        return self.data["image"]["ref"]


# --- session fixtures ----------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def engine() -> DockerEngine:
    """Podman's Docker-compatible service (what CI provisions); a clear failure when it is not there."""
    engine = DockerEngine("podman")
    try:
        engine.check()
    except EngineUnavailable as exc:
        pytest.fail(f"{exc} (CI runs .ci/provision.sh first)")
    if engine.inspect(BASE_IMAGE) is None:
        pytest.fail(f"the local base image {BASE_IMAGE} is missing: run .ci/provision.sh base_image")
    return engine


@pytest.fixture(scope="session")
def cnn(engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The bundled example, built, labelled and smoke-tested once for the session."""
    out = tmp_path_factory.mktemp("cnn") / "out"
    job = EXAMPLE / "job.yaml"
    return Built(job, out, build(job, "-o", out))


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheelhouse with the CPU torch wheel, fetched the way pip finds it on this machine (a local find-links
    folder here: an unpinned or index torch would be the CUDA build)."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                             "--disable-pip-version-check", "-q", "-d", str(folder), "torch==2.13.0"],
                            capture_output=True, text=True)
    wheels = list(folder.glob("torch-2.13.0*.whl"))
    assert result.returncode == 0 and wheels, f"could not get the torch wheel: {result.stderr[-1000:]}"
    assert "+cpu" in wheels[0].name, f"expected the CPU build of torch, got {wheels[0].name}"
    return folder


@pytest.fixture(scope="session")
def torch_image(engine: DockerEngine, wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """A PyTorch image whose torch comes from the target's wheelhouse (an offline site's route)."""
    folder = tmp_path_factory.mktemp("torch")
    # download.pytorch.org is not reachable here: the wheelhouse is the only source of the CPU torch wheel.
    write_target(folder, "local-cpu-wheels", python={"wheelhouse": str(wheelhouse), "recipe_indexes": False})
    job = write_job(folder, name="mlp-torch", model={"zoo": "mlp", "batch_size": 32}, frameworks=["pytorch"],
                    constraints={"runtimes": ["pytorch"]})
    out = folder / "out"
    return Built(job, out, build(job, "-o", out))


# --- the bundled example -------------------------------------------------------------------------------------

@pytest.mark.engine
def test_example_image_is_labelled_locked_and_smoke_tested(cnn: Built, engine: DockerEngine) -> None:
    data, out = cnn.data, cnn.out
    plan = json.loads((out / "plan.json").read_text())
    runtime = data["choice"]["runtime"]
    assert data["schema_version"] == 1 and data["choice"]["candidate"] == plan["choice"]
    assert data["engine"]["name"] == "podman"
    assert data["image"]["ref"].startswith("localhost/modak/mnist-cnn:")
    # Labels: OCI annotations, modak's decision, and the lock of what pip resolved.
    labels = image_labels(engine, cnn.ref)
    assert labels == data["image"]["labels"]
    assert labels["org.opencontainers.image.title"] == "mnist-cnn"
    assert labels["io.modak.runtime"] == runtime and labels["io.modak.target"] == "local-cpu"
    lock = (out / "requirements.lock").read_bytes()
    assert labels[LOCK_LABEL] == data["requirements_lock"]["digest"] == "sha256:" + hashlib.sha256(lock).hexdigest()
    assert "numpy==2.4.6" in lock.decode().splitlines()
    assert engine.read_file(cnn.ref, "/opt/modak/requirements.lock") == lock
    # The smoke test ran the plan's runtime inside the image, as the non-root user.
    smoke = data["smoke_test"]
    assert smoke["status"] == "ok" and smoke["runtime"] == runtime and smoke["device"] == "cpu"
    assert isinstance(smoke["threads"], int) and smoke["threads"] >= 1 and smoke["step_seconds"] > 0
    # at least 20 timed steps, their spread, and the plan's predicted interval with a verdict
    assert smoke["steps"] >= 20 and smoke["step_p10_seconds"] <= smoke["step_seconds"] <= smoke["step_p90_seconds"]
    choice = next(c for c in plan["candidates"] if c["name"] == plan["choice"])
    assert smoke["predicted_interval_seconds"] == choice["interval_seconds"]
    low, high = choice["interval_seconds"]
    assert smoke["within_prediction"] == (low <= smoke["step_seconds"] <= high)
    assert ("within the predicted interval" in smoke["message"]) == smoke["within_prediction"]
    # The engine left the CPUs to the container while it ran (Podman's wait endpoint spins a core of the host
    # until the container exits: containers/podman#18150; the run is inspected every 0.25 s instead).
    assert smoke["contention"]["other_cores"] < 0.5, smoke["contention"]
    # an inference image's smoke test also served one real infer request from inside the container
    assert smoke["serve"]["status"] == "ok" and smoke["serve"]["latency_s"] > 0
    assert json.loads((out / "smoke-test.json").read_text()) == smoke
    assert engine.client.api.inspect_image(cnn.ref)["Config"]["User"] == "modak"
    # The build log was streamed to the output folder, step by step.
    log = (out / "build.log").read_text()
    assert "STEP 1/" in log and "pip install" in log
    assert data["build_log"] == str(out / "build.log")
    assert {str(out / name) for name in ("Dockerfile", "job.sh", "requirements.lock", "build.log")} \
        <= set(data["artifacts"])


@pytest.mark.engine
def test_rebuild_without_changes_reuses_every_layer(cnn: Built, engine: DockerEngine) -> None:
    # The first rebuild takes in whatever changed since the session's build (modak's own sources are copied into
    # the image); the second one has nothing new and must reuse every layer.
    first = build(cnn.job, "-o", cnn.out, "--no-smoke")
    start = time.perf_counter()
    again = build(cnn.job, "-o", cnn.out, "--no-smoke")
    seconds = time.perf_counter() - start
    assert again["image"]["id"] == first["image"]["id"], "an unchanged rebuild must give the same image"
    log = (cnn.out / "build.log").read_text().splitlines()
    steps = [line for line in log if line.startswith("STEP ")]
    cached = [line for line in log if line.startswith("--> Using cache")]
    # Every step after FROM, in the main build and in the label stage, came from the cache.
    assert len(cached) == len(steps) - 2, "\n".join(log)
    assert seconds < 60, f"a no-change rebuild took {seconds:.1f} s"
    print(f"no-change rebuild: {seconds:.1f} s (modak build --no-smoke, end to end)")


def test_render_is_deterministic(tmp_path: Path) -> None:
    for name in ("a", "b"):
        result = modak("render", EXAMPLE / "job.yaml", "-o", tmp_path / name)
        assert result.returncode == 0, result.stderr
    for name in ("Dockerfile", "Singularity.def", "entrypoint.sh", "job.sh", "plan.json"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text(), name


# --- a PyTorch image from a wheelhouse ----------------------------------------------------------------------

@pytest.mark.engine
def test_torch_from_wheelhouse(torch_image: Built, engine: DockerEngine) -> None:
    data = torch_image.data
    assert data["choice"]["runtime"] == "pytorch"
    assert (torch_image.out / "wheels").is_dir() and list((torch_image.out / "wheels").glob("torch-2.13.0+cpu*.whl"))
    lock = (torch_image.out / "requirements.lock").read_text().splitlines()
    assert "torch==2.13.0+cpu" in lock, "torch must be the CPU wheel from the wheelhouse"
    log = (torch_image.out / "build.log").read_text()
    assert "STEP " in log
    smoke = data["smoke_test"]
    assert smoke["status"] == "ok" and smoke["runtime"] == "pytorch"
    assert smoke["versions"]["torch"] == "2.13.0+cpu"
    assert image_labels(engine, torch_image.ref)["io.modak.runtime"] == "pytorch"
    # The CA bundle and the wheelhouse were build-time mounts only: not in the image.
    assert engine.read_file(torch_image.ref, "/run/modak/ca.crt") is None
    # modak is installed as the modak-runtime wheel: the in-image code only, and the image's modak command
    site = "/opt/venv/lib/python3.11/site-packages/modak"
    assert engine.read_file(torch_image.ref, f"{site}/runtime/cli.py") is not None
    assert engine.read_file(torch_image.ref, f"{site}/plan.py") is None
    assert engine.read_file(torch_image.ref, "/opt/venv/bin/modak") is not None
    lock = engine.read_file(torch_image.ref, "/opt/modak/requirements.lock").decode()
    assert not {"scikit-learn", "matplotlib", "msgspec", "hatchling", "rich"} & {  # jinja2 comes with torch
        line.split("==")[0].lower() for line in lock.splitlines()}


# --- the image runs the user's job: serving, batch, training --------------------------------------------------

def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _onnx_reference(model: Path, feeds: dict[str, Any]) -> list[Any]:
    import onnxruntime

    return onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)


def _ready_client(container: Any, port: int) -> Any:
    """Triton's HTTP client of the server in ``container`` on ``port``, once the server says it is ready."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    deadline = time.monotonic() + 180
    while True:
        try:
            if client.is_server_ready():
                return client
        except Exception:  # not listening yet
            pass
        container.reload()
        assert container.status == "running", container.logs().decode()[-2000:]
        assert time.monotonic() < deadline, "the server did not become ready in 180 s"
        time.sleep(0.5)


@pytest.mark.engine
def test_served_image_answers_the_reference_client(cnn: Built, engine: DockerEngine) -> None:
    """The inference image's default command serves the Open Inference Protocol: Triton's reference client gets
    ONNX Runtime's outputs for the same inputs, /metrics counts the requests, SIGTERM ends it cleanly."""
    import numpy as np
    import tritonclient.http as httpclient

    port = _free_port()
    container = engine.client.containers.run(cnn.ref, detach=True, ports={"8080/tcp": ("127.0.0.1", port)})
    try:
        client = _ready_client(container, port)
        assert client.is_server_live()
        assert client.is_model_ready(cnn.data["job"]), "the model is served under the job's name"
        metadata = client.get_model_metadata(cnn.data["job"])
        (tensor,) = metadata["inputs"]
        assert tensor["datatype"] == "FP32" and tensor["shape"] == [-1, 1, 28, 28]
        x = np.random.default_rng(0).standard_normal((5, 1, 28, 28)).astype(np.float32)
        infer_input = httpclient.InferInput(tensor["name"], list(x.shape), "FP32")
        infer_input.set_data_from_numpy(x)
        result = client.infer(cnn.data["job"], [infer_input])
        expected = _onnx_reference(cnn.out / "model" / "model.onnx", {tensor["name"]: x})
        for output, reference in zip(metadata["outputs"], expected):
            np.testing.assert_allclose(result.as_numpy(output["name"]), reference, rtol=1e-3, atol=1e-4)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            assert "infer" in response.read().decode()
        container.stop(timeout=30)  # SIGTERM: graceful shutdown
        assert container.wait(timeout=60)["StatusCode"] == 0, container.logs().decode()[-2000:]
    finally:
        container.remove(force=True)


@pytest.mark.engine
@pytest.mark.netns
def test_batch_mode_in_the_image(cnn: Built, engine: DockerEngine, tmp_path: Path) -> None:
    """``modak run`` in the image over a folder of .npy/.npz files: outputs as ONNX Runtime's, each written once;
    a second run resumes (skips what is there, writes what is missing)."""
    import numpy as np

    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    outputs.mkdir()
    outputs.chmod(0o777)  # the image runs as uid 1000
    model = cnn.out / "model" / "model.onnx"
    import onnx

    name = onnx.load(str(model), load_external_data=False).graph.input[0].name
    rng = np.random.default_rng(1)
    items = {f"item{i}": rng.standard_normal((n, 1, 28, 28)).astype(np.float32) for i, n in enumerate([1, 5, 64, 70])}
    for stem, array in items.items():
        if stem == "item1":
            np.savez(inputs / f"{stem}.npz", **{name: array})
        else:
            np.save(inputs / f"{stem}.npy", array)

    def run() -> dict[str, Any]:
        container = engine.client.containers.run(
            cnn.ref, ["modak", "run", "--input", "/in", "--output", "/out", "--json", "--quiet"], detach=True,
            network_mode="none", volumes={str(inputs): {"bind": "/in", "mode": "ro"},
                                          str(outputs): {"bind": "/out", "mode": "rw"}})
        try:
            code = container.wait(timeout=300)["StatusCode"]
            stdout = container.logs(stdout=True, stderr=False).decode()
            assert code == 0, container.logs().decode()[-2000:]
        finally:
            container.remove(force=True)
        return json.loads(stdout.strip().splitlines()[-1])

    first = run()
    assert (first["done"], first["skipped"]) == (4, 0)
    assert sorted(p.name for p in outputs.iterdir()) == sorted(f"{stem}.npz" for stem in items)
    (outputs / "item0.npz").unlink()
    (outputs / "item2.npz").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in outputs.iterdir()}
    second = run()
    assert (second["done"], second["skipped"]) == (2, 2)
    assert {p.name: p.stat().st_mtime_ns for p in outputs.iterdir() if p.name in kept} == kept
    assert sorted(p.name for p in outputs.iterdir()) == sorted(f"{stem}.npz" for stem in items)
    for stem, array in items.items():
        with np.load(outputs / f"{stem}.npz", allow_pickle=False) as result:
            expected = _onnx_reference(model, {name: array})
            assert len(result.files) == len(expected)
            for got, reference in zip((result[key] for key in result.files), expected):
                np.testing.assert_allclose(got, reference, rtol=1e-3, atol=1e-4)


@pytest.mark.engine
def test_training_image_runs_the_users_script(engine: DockerEngine, wheelhouse: Path, tmp_path: Path) -> None:
    """examples/cnn-train-cpu built for real (torch from the wheelhouse, as in test_torch_from_wheelhouse): the
    image's default command is the user's train.py, which logs the plan it applies and a falling loss."""
    example = ROOT / "examples" / "cnn-train-cpu"
    folder = tmp_path / "spec"
    shutil.copytree(example, folder)
    target = yaml.safe_load((example / "target.yaml").read_text())
    target["python"] = {**target.get("python", {}), "wheelhouse": str(wheelhouse), "recipe_indexes": False}
    (folder / "target.yaml").write_text(yaml.safe_dump(target, sort_keys=False))
    data = build(folder / "job.yaml", "-o", tmp_path / "out")
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert data["smoke_test"]["status"] == "ok" and data["smoke_test"]["steps"] >= 20
    # planned for the network train.py trains (model.py's factory), no zoo stand-in; the image says so too
    assert plan["model_source"]["source"] == "model.py:build_model" and plan["deployment"]["zoo"] is None
    label = json.loads(image_labels(engine, data["image"]["ref"])["io.modak.model-source"])
    assert label["source"] == "model.py:build_model"
    outcome = engine.run(data["image"]["ref"], None, env={"STEPS": "30"}, timeout=600)
    assert outcome.exit_code == 0, outcome.stderr[-3000:]
    lines = outcome.stdout.splitlines()
    deployment = plan["deployment"]
    assert lines[0].startswith(f"modak plan: runtime {deployment['runtime']} on cpu, precision "
                               f"{deployment['precision']}")
    assert all(f"{name}={value}" in lines[0] for name, value in deployment["params"].items())
    done = lines[-1].split()
    assert done[0] == "done:" and float(done[6].rstrip(",")) < float(done[4]), lines[-1]  # loss A -> B: B < A


@pytest.mark.engine
def test_served_image_of_the_users_module_equals_eager_pytorch(engine: DockerEngine, wheelhouse: Path,
                                                                tmp_path: Path) -> None:
    """A job of the user's own module file and weights, built on PyTorch eager (torch from the wheelhouse): the
    image carries the module and says where the model came from, and what it serves is eager PyTorch's output
    on the host for the same inputs."""
    import runpy

    import numpy as np
    import torch
    import tritonclient.http as httpclient

    folder = tmp_path / "spec"
    write_target(folder, "local-cpu-wheels", python={"wheelhouse": str(wheelhouse), "recipe_indexes": False})
    (folder / "nets.py").write_text(MIXER_MODULE)
    torch.manual_seed(4)
    model = runpy.run_path(str(folder / "nets.py"))["build_model"](width=8)
    with torch.no_grad():
        model.norm.running_mean.uniform_(-0.5, 0.5)  # weights whose batch-norm statistics are not the defaults
        model.norm.running_var.uniform_(0.5, 1.5)
    torch.save(model.state_dict(), folder / "weights.pt")
    job = write_job(folder, name="own-module", model={
        "pytorch": {"module": "nets.py", "factory": "build_model", "kwargs": {"width": 8}, "weights": "weights.pt"},
        "input_shape": [3, 16, 16], "batch_size": 4}, frameworks=["pytorch"], constraints={"runtimes": ["pytorch"]})
    data = build(job, "-o", tmp_path / "out")
    assert data["choice"]["runtime"] == "pytorch" and data["smoke_test"]["status"] == "ok", data["smoke_test"]
    source = json.loads(image_labels(engine, data["image"]["ref"])["io.modak.model-source"])
    assert source["source"] == "nets.py:build_model" and set(source["digests"]) >= {"module", "weights"}
    with _serving(engine, data) as (client, _, metadata):
        (tensor,) = metadata["inputs"]
        assert tensor["datatype"] == "FP32" and tensor["shape"] == [-1, 3, 16, 16]
        x = np.random.default_rng(0).standard_normal((5, 3, 16, 16)).astype(np.float32)
        infer_input = httpclient.InferInput(tensor["name"], list(x.shape), "FP32")
        infer_input.set_data_from_numpy(x)
        result = client.infer(data["job"], [infer_input])
        with torch.no_grad():
            expected = model.eval()(torch.from_numpy(x)).numpy()
        (output,) = metadata["outputs"]
        np.testing.assert_allclose(result.as_numpy(output["name"]), expected, rtol=1e-4, atol=1e-5)


@contextlib.contextmanager
def _serving(engine: DockerEngine, data: dict[str, Any]) -> Iterator[tuple[Any, int, dict[str, Any]]]:
    """The built image (``build --json``'s ``data``) serving on a free port: Triton's client of it, the port and
    the model's metadata, once the server says it is ready; the container is removed after."""
    port = _free_port()
    container = engine.client.containers.run(data["image"]["ref"], detach=True,
                                             ports={"8080/tcp": ("127.0.0.1", port)})
    try:
        client = _ready_client(container, port)
        yield client, port, client.get_model_metadata(data["job"])
    finally:
        container.remove(force=True)


def _build_on_onnxruntime(example: str, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """examples/EXAMPLE on this machine's target, built on ONNX Runtime: its job file and ``build --json``."""
    folder = tmp_path / "spec"
    shutil.copytree(ROOT / "examples" / example, folder)
    write_target(folder, "local-cpu")
    job_path = folder / "job.yaml"
    job = yaml.safe_load(job_path.read_text())
    job.update(target="target.yaml", constraints={"runtimes": ["onnxruntime"]})
    job_path.write_text(yaml.safe_dump(job, sort_keys=False))
    return job_path, build(job_path, "-o", tmp_path / "out")


@pytest.mark.engine
def test_served_image_answers_text_through_the_jobs_tokenizer(engine: DockerEngine, tmp_path: Path) -> None:
    """examples/hf-text (a BERT classifier as its users write it, and its tokenizer) built on ONNX Runtime: the
    image takes a KServe v2 BYTES request of text from the reference client and answers what eager PyTorch
    answers on transformers' own tokenization of the same texts; its smoke test served text too."""
    import numpy as np
    import tritonclient.http as httpclient

    from tests.test_hf_models import eager_logits

    job_path, data = _build_on_onnxruntime("hf-text", tmp_path)
    assert data["smoke_test"]["status"] == "ok" and data["smoke_test"]["serve"]["raw_outputs"] == {"logits": [2, 3]}, \
        data["smoke_test"]
    with _serving(engine, data) as (client, port, metadata):
        assert metadata["inputs"][0] == {"name": "text", "datatype": "BYTES", "shape": [-1]}, metadata
        texts = ["modak builds the image and serves it.", "A second text, " * 20, "short"]
        given = httpclient.InferInput("text", [len(texts)], "BYTES")
        given.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
        result = client.infer(data["job"], [given])
        np.testing.assert_allclose(result.as_numpy("logits"), eager_logits(job_path, texts), rtol=1e-4, atol=1e-5)
        assert "modak_preprocess_seconds_count 1.0" in urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()


@pytest.mark.engine
def test_served_image_answers_images_through_the_jobs_processor_and_labels(engine: DockerEngine,
                                                                          tmp_path: Path) -> None:
    """examples/hf-vision (a ViT classifier as its users write it, its image processor and its labels function)
    built on ONNX Runtime: the image takes encoded images as a KServe v2 BYTES request from the reference client
    and answers the label and probability that eager PyTorch gives on transformers' own processing."""
    import numpy as np
    import tritonclient.http as httpclient

    from tests.test_processing import IMAGES, _encoded, eager_labels

    job_path, data = _build_on_onnxruntime("hf-vision", tmp_path)
    assert data["smoke_test"]["status"] == "ok" \
        and data["smoke_test"]["serve"]["raw_outputs"] == {"label": [2], "probability": [2]}, data["smoke_test"]
    with _serving(engine, data) as (client, port, metadata):
        assert metadata["inputs"][0] == {"name": "image", "datatype": "BYTES", "shape": [-1]}, metadata
        images = [_encoded(size, mode, seed) for seed, (size, mode) in enumerate(IMAGES)]
        given = httpclient.InferInput("image", [len(images)], "BYTES")
        given.set_data_from_numpy(np.array([encoded for encoded, _ in images], dtype=object))
        result = client.infer(data["job"], [given])
        labels, probabilities = eager_labels(job_path, [image for _, image in images])
        assert [label.decode() for label in result.as_numpy("label")] == labels
        np.testing.assert_allclose(result.as_numpy("probability"), probabilities, rtol=1e-4)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        assert "modak_preprocess_seconds_count 1.0" in metrics and "modak_postprocess_seconds_count 1.0" in metrics


# --- failures ------------------------------------------------------------------------------------------------

@pytest.mark.engine
def test_failing_build_step_leaves_no_tag_and_keeps_the_log(cnn: Built, engine: DockerEngine,
                                                            tmp_path: Path) -> None:
    write_target(tmp_path, "local-cpu")
    # Conflicts with the recipe's numpy pin: pip fails inside the RUN step.
    job = write_job(tmp_path, name="broken-build", entrypoint={"requirements": ["numpy==1.0.0"]})
    out = tmp_path / "out"
    plan = json.loads(modak("plan", job, "--json").stdout)
    result = modak("build", job, "-o", out)
    assert result.returncode == EXIT_BUILD_FAILED, result.stderr
    lines = result.stderr.strip().splitlines()  # progress lines (phases, steps), then the error: one line
    message = lines[-1]
    assert [line for line in lines if line.startswith("modak: error:")] == [message]
    assert message.startswith("modak: error: build failed at step 6/")
    assert "RUN" in message and "pip install" in message and str(out / "build.log") in message
    log = (out / "build.log").read_text()
    assert "numpy==1.0.0" in log and "STEP 6/" in log
    tag = f"localhost/modak/broken-build:{plan['choice'].split('/')[0]}-"
    assert not [t for t in _all_tags(engine) if t.startswith(tag)], "a failed build must not leave a tag"
    assert not (out / "smoke-test.json").exists() and not (out / "requirements.lock").exists()


@pytest.mark.engine
def test_ctrl_c_leaves_no_tag_and_keeps_the_log(cnn: Built, engine: DockerEngine, tmp_path: Path) -> None:
    write_target(tmp_path, "local-cpu")
    # A requirement of its own makes the pip step new, so the build is still running when Ctrl-C comes; the
    # never-matching exclusion makes it new on every run too (an earlier run's layer would be cached).
    requirement = f"six==1.16.0,!=0.0.{time.time_ns() % 10**9}"
    for stale in [t for t in _all_tags(engine) if t.startswith("localhost/modak/interrupted-build:")]:
        engine.remove(stale)  # a run whose Ctrl-C never arrived (SIGINT ignored) tagged one
    job = write_job(tmp_path, name="interrupted-build", entrypoint={"requirements": [requirement]})
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "modak", "build", str(job), "-o", str(out)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    deadline = time.monotonic() + 300
    log = out / "build.log"
    while time.monotonic() < deadline and process.poll() is None:
        if log.exists() and "STEP 6/" in log.read_text():
            break
        time.sleep(0.2)
    assert process.poll() is None, f"the build ended before it could be interrupted: {process.communicate()}"
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == EXIT_INTERRUPTED, stderr
    assert "interrupted at step 6/" in stderr and "no image was tagged" in stderr and str(log) in stderr
    assert "# modak: interrupted at step 6/" in log.read_text()
    # Podman may finish the build after the client went away: still nothing is tagged.
    time.sleep(2)
    assert not [t for t in _all_tags(engine) if t.startswith("localhost/modak/interrupted-build:")]


# --- concurrent builds ---------------------------------------------------------------------------------------

@pytest.mark.engine
def test_concurrent_builds_keep_their_contexts_and_tags(engine: DockerEngine, tmp_path: Path) -> None:
    """Two ``modak build`` processes of two jobs at once (their own targets and batch sizes, the same runtime so
    that the pip layer is shared): each image carries its own job's plan and labels, each output folder its own."""
    jobs = {}
    for name, batch in (("concurrent-a", 16), ("concurrent-b", 32)):
        folder = tmp_path / name
        write_target(folder, f"local-cpu-{name}")
        jobs[name] = write_job(folder, name=name, model={"zoo": "mnist_cnn", "input_shape": [1, 28, 28],
                                                         "batch_size": batch},
                               constraints={"runtimes": ["onnxruntime"]})
    processes = {name: subprocess.Popen([sys.executable, "-m", "modak", "build", str(job), "-o",
                                         str(job.parent / "out"), "--no-smoke", "--json"], cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for name, job in jobs.items()}
    results = {}
    for name, process in processes.items():
        stdout, stderr = process.communicate(timeout=1800)
        assert process.returncode == 0, f"{name}: {stderr[-3000:]}"
        results[name] = json.loads(stdout)
    assert results["concurrent-a"]["image"]["ref"] != results["concurrent-b"]["image"]["ref"]
    for name, data in results.items():
        out = jobs[name].parent / "out"
        assert data["output"] == str(out)
        plan_json = (out / "plan.json").read_bytes()
        plan = json.loads(plan_json)
        assert plan["job"] == name and plan["target"] == f"local-cpu-{name}"
        labels = image_labels(engine, data["image"]["ref"])
        assert labels["io.modak.target"] == f"local-cpu-{name}"
        assert labels["io.modak.plan-digest"] == hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
        assert engine.read_file(data["image"]["ref"], "/opt/modak/plan.json") == plan_json
        assert f"# modak: building {out} with" in (out / "build.log").read_text()


def test_a_second_build_into_a_busy_output_folder_fails_at_once(tmp_path: Path) -> None:
    """While something holds the output folder's lock (here this test, through the pipeline's own lock), a build
    into it is an input error naming the folder and the holder, and writes nothing there."""
    out = tmp_path / "out"
    with out_dir_lock(out):
        result = modak("build", EXAMPLE / "job.yaml", "-o", out, "--no-smoke")
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr.strip() == (f"modak: error: {out}: another modak build (process {os.getpid()}) is using "
                                     "this output folder; wait for it to end or choose another --output")
    assert sorted(p.name for p in out.iterdir()) == [OUT_DIR_LOCK]


def test_engine_not_reachable(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = modak("build", EXAMPLE / "job.yaml", "-o", out,
                   env={"DOCKER_HOST": f"unix://{tmp_path}/no-such-podman.sock"})
    assert result.returncode == EXIT_ENGINE_UNAVAILABLE
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "not reachable" in message
    assert ".ci/provision.sh podman_service" in message and "no-such-podman.sock" in message
    assert not out.exists(), "nothing is written when the engine is not reachable"


def _folder_files(engine: DockerEngine, ref: str, folder: str) -> dict[str, bytes]:
    """The files under ``folder`` in the image, by their path in the archive (the folder's name first).

    The whole folder: Podman's archive API does not find single paths with some of the hostile characters."""
    import io

    container = engine.client.containers.create(ref, ["true"], network_mode="none")
    try:
        stream, _ = container.get_archive(folder)
        data = b"".join(stream)
    finally:
        container.remove(force=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}


def _all_tags(engine: DockerEngine) -> list[str]:
    return [tag for image in engine.client.api.images() for tag in image.get("RepoTags") or ()]


# --- hostile strings in a real build -------------------------------------------------------------------------

@pytest.mark.engine
@pytest.mark.netns
def test_hostile_strings_stay_data_in_a_real_image(cnn: Built, engine: DockerEngine, tmp_path: Path) -> None:
    """Hostile free text (command, file name, model file and input names) in a real build and a real run: the
    command's arguments arrive verbatim and nothing the strings say is executed."""
    folder = tmp_path / "spec"
    bad = "".join(HOSTILE).replace("/", "_")
    model = Path(f"m {bad}") / f"model {bad.replace(chr(92), '_')}.onnx"  # onnx reads a backslash as a separator
    write_onnx(folder / model, input_name=f"x{bad}")
    (folder / bad).write_text("user file\n")
    write_target(folder, "local-cpu")
    runtime = cnn.data["choice"]["runtime"]  # the same pip layer as the example: only the cheap layers are new
    job = write_job(folder, name="hostile", model={"onnx": str(model), "batch_size": 2},
                    constraints={"runtimes": [runtime]},
                    entrypoint={"command": ["printf", "%s\\0", *HOSTILE], "files": [bad]})
    assert not Path("/tmp/PWNED").exists(), "remove /tmp/PWNED left by something else first"
    data = build(job, "-o", tmp_path / "out", "--no-smoke")
    ref = data["image"]["ref"]
    assert _folder_files(engine, ref, "/opt/app") == {f"app/{bad}": b"user file\n"}
    container = engine.client.containers.create(ref, network_mode="none")  # the image's default command
    try:
        container.start()
        assert container.wait(timeout=120)["StatusCode"] == 0
        stdout = container.logs(stdout=True, stderr=False).decode()
        changes = [change["Path"] for change in container.diff() or []]
    finally:
        container.remove(force=True)
    assert stdout.split("\0")[:-1] == HOSTILE
    assert not [path for path in changes if "PWNED" in path], changes
    assert engine.read_file(ref, "/tmp/PWNED") is None
    assert not Path("/tmp/PWNED").exists()
    plan = json.loads(engine.read_file(ref, "/opt/modak/plan.json"))  # what the image's launcher applies
    assert plan["deployment"]["input_shapes"] == {f"x{bad}": [4]}


# --- push to a real registry ---------------------------------------------------------------------------------

@pytest.mark.engine
def test_push_pull_and_labels(cnn: Built, engine: DockerEngine, tmp_path: Path) -> None:
    try:
        urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=5).close()
    except OSError as exc:
        pytest.fail(f"no registry on {REGISTRY} ({exc}): run .ci/provision.sh registry")
    target = write_target(tmp_path, "local-registry", container={"registry": f"{REGISTRY}/modak-test"})
    archive = tmp_path / "image.tar"
    data = build(EXAMPLE / "job.yaml", "--target", target, "-o", tmp_path / "out", "--push", "--no-smoke",
                 "--oci-archive", archive)
    ref = data["image"]["ref"]
    assert ref.startswith(f"{REGISTRY}/modak-test/mnist-cnn:") and data["pushed"]["ref"] == ref
    assert data["pushed"]["digest"].startswith("sha256:")
    labels = data["image"]["labels"]
    # What the registry stores, read over its own HTTP API.
    assert registry_labels(ref) == labels
    # Pulled back into the engine after removing the local name.
    engine.remove(ref)
    assert engine.inspect(ref) is None
    assert dict(engine.pull(ref).labels) == labels
    assert labels["io.modak.target"] == "local-registry" and labels[LOCK_LABEL].startswith("sha256:")
    # The docker-archive that `apptainer build x.sif docker-archive://FILE` reads.
    assert data["oci_archive"] == str(archive)
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert any(ref in (entry.get("RepoTags") or []) or f"{ref.split(':')[0]}:{ref.split(':')[-1]}"
               in (entry.get("RepoTags") or []) for entry in manifest), manifest
    archive.unlink()


# --- push to a registry that requires a login ----------------------------------------------------------------

AUTH_REGISTRY = "127.0.0.1:5001"  # .ci/provision.sh auth_registry, with these test credentials
AUTH_USER = os.environ.get("MODAK_AUTH_REGISTRY_USER", "modak-push")
AUTH_PASSWORD = os.environ.get("MODAK_AUTH_REGISTRY_PASSWORD", "Zq7-modak-registry-secret-w9pL")


def _require_auth_registry() -> None:
    request = urllib.request.Request(f"http://{AUTH_REGISTRY}/v2/", headers={
        "Authorization": "Basic " + base64.b64encode(f"{AUTH_USER}:{AUTH_PASSWORD}".encode()).decode()})
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except OSError as exc:
        pytest.fail(f"no registry accepting the test login on {AUTH_REGISTRY} ({exc}): "
                    "run .ci/provision.sh auth_registry")


def _no_login_env(tmp_path: Path) -> dict[str, str]:
    """An environment where modak finds no registry credentials (every auth file location is an empty folder)."""
    empty = tmp_path / "no-auth"
    empty.mkdir(exist_ok=True)
    return {"MODAK_REGISTRY_USERNAME": "", "MODAK_REGISTRY_PASSWORD": "", "REGISTRY_AUTH_FILE": "",
            "XDG_RUNTIME_DIR": str(empty), "XDG_CONFIG_HOME": str(empty), "DOCKER_CONFIG": str(empty)}


def _assert_secret_absent(where: str, data: bytes | str) -> None:
    data = data.encode() if isinstance(data, str) else data
    for secret in (AUTH_PASSWORD, base64.b64encode(f"{AUTH_USER}:{AUTH_PASSWORD}".encode()).decode()):
        assert secret.encode() not in data, f"the registry password is in {where}"


def _push_to_auth_registry(tmp_path: Path, name: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``modak build --push --no-smoke --json`` of the example to ``AUTH_REGISTRY/name``."""
    target = write_target(tmp_path / name, f"auth-{name}", container={"registry": f"{AUTH_REGISTRY}/{name}"})
    return modak("build", EXAMPLE / "job.yaml", "--target", target, "-o", tmp_path / name / "out", "--push",
                 "--no-smoke", "--json", env={**_no_login_env(tmp_path), **env})


@pytest.mark.engine
def test_push_with_credentials_from_an_auth_file_keeps_them_secret(engine: DockerEngine, tmp_path: Path) -> None:
    """Credentials from a Docker/Podman auth file (``REGISTRY_AUTH_FILE``): the push and the pull-back succeed, the
    registry has the image's labels, and the password is nowhere modak writes or builds: not in stdout, stderr,
    the ``--json`` output or the build log, not in the image's config, labels and history, nor in its layers."""
    _require_auth_registry()
    auth_file = tmp_path / "auth.json"
    login = base64.b64encode(f"{AUTH_USER}:{AUTH_PASSWORD}".encode()).decode()
    auth_file.write_text(json.dumps({"auths": {AUTH_REGISTRY: {"auth": login}}}))
    result = _push_to_auth_registry(tmp_path, "modak-auth-file", {"REGISTRY_AUTH_FILE": str(auth_file)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"with the credentials from {auth_file}" in result.stderr
    data = json.loads(result.stdout)
    ref = data["image"]["ref"]
    assert data["pushed"]["ref"] == ref and data["pushed"]["digest"].startswith("sha256:")
    assert registry_labels(ref, (AUTH_USER, AUTH_PASSWORD)) == data["image"]["labels"]
    with pytest.raises(urllib.error.HTTPError, match="401"):  # the registry does require the login
        registry_labels(ref)
    _assert_secret_absent("stdout", result.stdout)
    _assert_secret_absent("stderr", result.stderr)
    _assert_secret_absent("build.log", (Path(data["build_log"])).read_bytes())
    _assert_secret_absent("the image's inspect output", json.dumps(engine.client.api.inspect_image(ref)))
    _assert_secret_absent("the image's history", json.dumps(engine.client.api.history(ref)))
    archive = tmp_path / "image.tar"  # docker-archive: the layers are uncompressed tar files inside
    engine.save(ref, archive)
    with tarfile.open(archive) as outer:
        layers = [m for m in outer.getmembers() if m.isfile()]
        assert len(layers) > 3
        for member in layers:
            _assert_secret_absent(f"{member.name} of the saved image", outer.extractfile(member).read())
    archive.unlink()


@pytest.mark.engine
def test_push_with_credentials_from_the_environment_and_refusals(engine: DockerEngine, tmp_path: Path) -> None:
    """``MODAK_REGISTRY_USERNAME``/``MODAK_REGISTRY_PASSWORD``: the push succeeds and the image pulls back with the
    same login after its local name is removed. Without credentials, or with a wrong password, the push is
    refused: exit 8 and one line that says what to do, without the password it tried."""
    _require_auth_registry()
    name = "modak-auth-env"
    env = {"MODAK_REGISTRY_USERNAME": AUTH_USER, "MODAK_REGISTRY_PASSWORD": AUTH_PASSWORD}
    result = _push_to_auth_registry(tmp_path, name, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "with the credentials from MODAK_REGISTRY_USERNAME/MODAK_REGISTRY_PASSWORD" in result.stderr
    _assert_secret_absent("stdout", result.stdout)
    _assert_secret_absent("stderr", result.stderr)
    data = json.loads(result.stdout)
    ref = data["image"]["ref"]
    assert registry_labels(ref, (AUTH_USER, AUTH_PASSWORD)) == data["image"]["labels"]
    engine.remove(ref)
    assert engine.inspect(ref) is None
    from modak.build.credentials import Credentials
    assert dict(engine.pull(ref, Credentials(AUTH_REGISTRY, AUTH_USER, AUTH_PASSWORD, "test")).labels) \
        == data["image"]["labels"]

    refused = _push_to_auth_registry(tmp_path, name, {})
    assert refused.returncode == EXIT_PUSH_FAILED, refused.stderr[-3000:]
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith(f"modak: error: pushing {ref} failed: ") and "unauthorized" in error
    assert f"no credentials for {AUTH_REGISTRY}: set MODAK_REGISTRY_USERNAME and MODAK_REGISTRY_PASSWORD" in error

    wrong = "wrong-Hq4-modak-password"
    refused = _push_to_auth_registry(tmp_path, name, {**env, "MODAK_REGISTRY_PASSWORD": wrong})
    assert refused.returncode == EXIT_PUSH_FAILED, refused.stderr[-3000:]
    assert "refused the credentials from MODAK_REGISTRY_USERNAME/MODAK_REGISTRY_PASSWORD" in refused.stderr
    assert wrong not in refused.stderr + refused.stdout + (tmp_path / name / "out" / "build.log").read_text()


# --- a real scheduler ----------------------------------------------------------------------------------------

def _require_slurm() -> None:
    try:
        result = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.fail("Slurm is not installed: run .ci/provision.sh slurm")
    states = result.stdout.split()
    if result.returncode != 0 or not any(s.rstrip("*") in ("idle", "mixed", "allocated") for s in states):
        pytest.fail(f"no usable Slurm node ({result.stderr.strip() or states}): run .ci/provision.sh slurm")


@pytest.mark.engine
@pytest.mark.slurm
def test_slurm_job_runs_the_built_image(cnn: Built, engine: DockerEngine, tmp_path: Path) -> None:
    """``modak build --submit`` on a Slurm target: the job script's ``podman run`` (as the submitting user, root,
    sharing the storage of root's Podman service) runs the image; its output is the self-test's JSON."""
    _require_slurm()
    target = write_target(tmp_path, "local-slurm", scheduler={"kind": "slurm", "partition": "debug",
                                                              "time_limit": "00:10:00"})
    out = tmp_path / "out"
    data = build(EXAMPLE / "job.yaml", "--target", target, "-o", out, "--submit")
    runtime = data["choice"]["runtime"]
    job_id = data["job_id"]
    assert job_id and job_id.isdigit() and data["submission"]["scheduler"] == "slurm"
    submission = wait(Submission("slurm", job_id, out / "job.sh", out, Path(data["submission"]["output"])),
                      timeout=300)
    output = Path(data["submission"]["output"])
    assert output == out / f"mnist-cnn-{job_id}.out"
    text = output.read_text() if output.exists() else "(no output file)"
    assert submission.state == "COMPLETED" and submission.exit_code == 0, text
    report = parse_self_test(text)
    assert report and report["status"] == "ok" and report["runtime"] == runtime, text
    assert report["threads"] == 2  # the job's --cpus-per-task, through SLURM_CPUS_PER_TASK into the container

    # `modak submit` alone: renders the same job script and submits it again, waiting for it.
    again = modak("submit", EXAMPLE / "job.yaml", "--target", target, "-o", out, "--wait", "300", "--json")
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["state"] == "COMPLETED" and second["exit_code"] == 0 and second["job_id"] != job_id
    assert parse_self_test(Path(second["output"]).read_text())["runtime"] == runtime


@pytest.mark.engine
def test_the_job_script_runs_batch_inference_into_its_results_folder(cnn: Built, tmp_path: Path) -> None:
    """A job with a data set and a results folder: its job script, run as root here (the engine's user), runs
    ``modak run`` over the data in the image as the image's own user, which it gives the folder it creates; the
    results are the model's answers."""
    import numpy as np
    import onnxruntime as ort

    from modak.workload.zoo import export_onnx

    inputs = tmp_path / "digits"
    inputs.mkdir()
    x = np.random.default_rng(0).random((5, 1, 28, 28), dtype=np.float32)
    np.save(inputs / "five.npy", x)
    write_target(tmp_path, "local-cpu")
    results = tmp_path / "results"
    job = write_job(tmp_path, name="mnist-batch", data={"location": str(inputs), "output": str(results)})
    out = tmp_path / "out"
    build(job, "-o", out)  # the example's layers are cached: a build of labels and the smoke test
    run = subprocess.run(["bash", str(out / "job.sh")], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert results.stat().st_uid == 1000  # the image's user, not root
    with np.load(results / "five.npz") as answers:
        outputs = dict(answers)
    session = ort.InferenceSession(str(export_onnx("mnist_cnn")), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input": x})[0]
    assert len(outputs) == 1 and np.allclose(next(iter(outputs.values())), expected, rtol=1e-3, atol=1e-4)


# --- pieces without an engine --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, stdout, expected", [
    ("slurm", "12345\n", "12345"), ("slurm", "12345;cluster\n", "12345"),
    ("pbs", "4711.pbs-server\n", "4711.pbs-server"), ("pbs", "4711[].server\n", "4711[].server"),
])
def test_job_id_parsing(kind: str, stdout: str, expected: str) -> None:
    assert scheduler(kind).parse_job_id(stdout) == expected


@pytest.mark.parametrize("kind, stdout", [("slurm", ""), ("slurm", "Submitted batch job 1\n"), ("pbs", "x y")])
def test_job_id_parsing_rejects_other_output(kind: str, stdout: str) -> None:
    with pytest.raises(SubmitFailed):
        scheduler(kind).parse_job_id(stdout)


def test_output_file_names(tmp_path: Path) -> None:
    assert scheduler("slurm").output_file("job-%j.out", "42", tmp_path) == tmp_path / "job-42.out"
    assert scheduler("pbs").output_file("job.out", "42.server", tmp_path) == tmp_path / "job.out"


def test_build_log_tracks_steps(tmp_path: Path) -> None:
    seen: list[Step] = []
    log = BuildLog(tmp_path / "build.log", on_step=seen.append)
    log.write("STEP 1/3: FROM x\nSTEP 2/3: RUN pip ins")
    log.write("tall foo\nsome output\n")
    log.close()
    assert [(s.number, s.total) for s in seen] == [(1, 3), (2, 3)]
    assert seen[-1].instruction == "RUN pip install foo"
    failure = log.failure("exit status 1")
    assert failure.exit_code == EXIT_BUILD_FAILED and "step 2/3 (RUN pip install foo)" in str(failure)
    assert (tmp_path / "build.log").read_text().endswith("some output\n")


@pytest.mark.parametrize("ref, expected", [
    ("localhost/modak/x:tag", ("localhost/modak/x", "tag")), ("127.0.0.1:5000/a/b:c", ("127.0.0.1:5000/a/b", "c")),
    ("127.0.0.1:5000/a/b", ("127.0.0.1:5000/a/b", "latest")),
])
def test_split_ref(ref: str, expected: tuple[str, str]) -> None:
    assert split_ref(ref) == expected


def test_tuned_tvm_database_is_found(tmp_path: Path) -> None:
    """For TVM, the MetaSchedule database `modak bench` left for this model and batch goes into the image."""
    from modak.api import load as load_job
    from modak.plan import make_plan
    from modak.workload.source import load_analysis

    folder = tmp_path / "spec"
    write_target(folder, "local-cpu")
    job = write_job(folder, constraints={"runtimes": ["tvm"]})
    loaded = load_job(job)
    plan = make_plan(loaded, *load_analysis(loaded))
    assert plan.choice.candidate.runtime == "tvm"
    work = tmp_path / "work"
    database = work / "tvm" / "tvm-tuning" / "mnist_cnn-b64-0123456789ab"
    database.mkdir(parents=True)
    (database / "modak-tuned.json").write_text('{"trials": 200}')
    (work / "tvm" / "tvm-tuning" / "mnist_cnn-b32-0123456789ab").mkdir()  # another batch: not this job's
    assert tuned_artifacts(plan, work) == {"/tmp/modak/tvm-tuning/mnist_cnn-b64-0123456789ab": database}


@pytest.mark.engine
def test_smoke_test_checks_the_runtime(cnn: Built, engine: DockerEngine, tmp_path: Path) -> None:
    """The smoke test really runs the image: the example's image, checked against a plan that chose another
    runtime, fails with exit code 6 and keeps the run's output."""
    from modak.api import load as load_job
    from modak.build.pipeline import smoke_test
    from modak.errors import EXIT_SMOKE_FAILED, SmokeTestFailed
    from modak.plan import make_plan
    from modak.workload.source import load_analysis

    built = cnn.data["choice"]["runtime"]
    other = "onnxruntime" if built != "onnxruntime" else "openvino"
    folder = tmp_path / "spec"
    write_target(folder, "local-cpu")
    loaded = load_job(write_job(folder, constraints={"runtimes": [other]}))
    plan = make_plan(loaded, *load_analysis(loaded))
    log = tmp_path / "smoke-test.log"
    with pytest.raises(SmokeTestFailed) as error:
        smoke_test(engine, cnn.ref, plan, timeout=300, log=log)
    assert error.value.exit_code == EXIT_SMOKE_FAILED
    assert f"ran runtime '{built}', but the plan chose '{other}'" in str(error.value)
    assert f'"runtime": "{built}"' in log.read_text()
