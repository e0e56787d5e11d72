"""Singularity images for real (#64): ``modak build --engine apptainer`` builds a SIF with Apptainer, which is
inspected, tested, run, served, run as an unprivileged user and submitted to the local Slurm, and gives the Docker
image's outputs.

What the tests need is what ``.ci/provision.sh`` sets up: an ``apptainer`` on PATH (on Debian 12 ``.ci/apptainer``,
Debian sid's Apptainer 1.4 in Podman, since Debian 12's glibc is too old for it), the local base image, and Slurm. A
missing one is a failure with the command that provides it, never a skip. The SIF is built once per session.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from modak.build.engines import parse_self_test
from modak.build.engines.apptainer import ApptainerEngine
from modak.errors import EXIT_BUILD_FAILED
from modak.render.ir import LOCK_LABEL
from tests.test_build import EXAMPLE, Built, _onnx_reference, _require_slurm, build, modak, write_job, write_target

pytestmark = pytest.mark.apptainer
UNPRIVILEGED = {"MODAK_APPTAINER_USER": "1000:1000"}  # .ci/apptainer: run Apptainer as this user, not root


def apptainer(*args: str | Path, env: dict[str, str] | None = None, timeout: float = 600,
              cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["apptainer", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def sif(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The bundled example, built as a SIF, labelled and smoke-tested once for the session."""
    if shutil.which("apptainer") is None and shutil.which("singularity") is None:
        pytest.fail("no apptainer on PATH: run .ci/provision.sh apptainer_install")
    out = tmp_path_factory.mktemp("sif") / "out"
    job = EXAMPLE / "job.yaml"
    return Built(job, out, build(job, "-o", out, "--engine", "apptainer"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_sif_is_labelled_locked_and_smoke_tested(sif: Built) -> None:
    data, out = sif.data, sif.out
    plan = json.loads((out / "plan.json").read_text())
    sif_file = Path(sif.ref)
    assert data["engine"]["name"] == "apptainer" and sif_file == out / "mnist-cnn.sif" and sif_file.is_file()
    assert not list(out.glob(".build.*")) and not (out / "base-image.tar").exists()  # no partial SIF, no archive
    # `apptainer inspect`: the labels the Dockerfile gives the Docker image (the same rendered list), and the lock
    labels = ApptainerEngine().inspect(sif.ref).labels
    rendered = [line.strip() for line in (out / "Singularity.def").read_text().split("%labels")[1]
                .split("%help")[0].splitlines() if line.strip()]
    assert {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in rendered}.items() <= labels.items()
    assert labels["io.modak.plan-digest"] == hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
    assert labels["io.modak.runtime"] == data["choice"]["runtime"] and labels["io.modak.target"] == "local-cpu"
    lock = (out / "requirements.lock").read_bytes()
    assert labels[LOCK_LABEL] == data["requirements_lock"]["digest"] == "sha256:" + hashlib.sha256(lock).hexdigest()
    assert "numpy==2.4.6" in lock.decode().splitlines()
    # the build's smoke test timed the plan's runtime inside the SIF against the prediction, and served a request
    smoke = data["smoke_test"]
    assert smoke["status"] == "ok" and smoke["runtime"] == data["choice"]["runtime"] and smoke["steps"] >= 20
    choice = next(c for c in plan["candidates"] if c["name"] == plan["choice"])
    assert smoke["predicted_interval_seconds"] == choice["interval_seconds"]
    assert smoke["serve"]["status"] == "ok"
    assert "Bootstrap: docker-archive" in (out / "Singularity.def").read_text()  # the local base image, no registry


def test_apptainer_test_runs_the_smoke_test(sif: Built) -> None:
    result = apptainer("test", sif.ref, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = parse_self_test(result.stdout)
    assert report and report["status"] == "ok" and report["runtime"] == sif.data["choice"]["runtime"]


def _serve(sif: Built, env: dict[str, str] | None = None) -> None:
    """``apptainer run`` of the SIF (its default command: the server) on a free port, answered by Triton's client
    as ONNX Runtime answers; SIGTERM ends it."""
    import numpy as np
    import tritonclient.http as httpclient

    port = free_port()
    process = subprocess.Popen(["apptainer", "run", "--env", f"MODAK_PORT={port}", sif.ref],
                               env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 180
        while True:
            try:
                if client.is_server_ready():
                    break
            except Exception:  # not listening yet
                pass
            assert process.poll() is None, process.stdout.read()[-3000:] if process.stdout else ""
            assert time.monotonic() < deadline, "the server did not become ready in 180 s"
            time.sleep(0.5)
        name = sif.data["job"]
        (tensor,) = client.get_model_metadata(name)["inputs"]
        x = np.random.default_rng(0).standard_normal((3, 1, 28, 28)).astype(np.float32)
        request = httpclient.InferInput(tensor["name"], list(x.shape), "FP32")
        request.set_data_from_numpy(x)
        result = client.infer(name, [request])
        expected = _onnx_reference(sif.out / "model" / "model.onnx", {tensor["name"]: x})
        outputs = client.get_model_metadata(name)["outputs"]
        for output, reference in zip(outputs, expected):
            np.testing.assert_allclose(result.as_numpy(output["name"]), reference, rtol=1e-3, atol=1e-4)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def test_the_sif_serves_kserve_v2(sif: Built) -> None:
    _serve(sif)


@pytest.fixture
def readable(tmp_path: Path):
    """A folder every user may read and write (pytest's are root's alone), removed after the test."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="modak-test-", dir="/var/tmp"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_an_unprivileged_user_runs_and_serves_the_sif(sif: Built, readable: Path) -> None:
    copy = readable / "mnist-cnn.sif"
    shutil.copy(sif.ref, copy)
    copy.chmod(0o644)
    result = apptainer("exec", copy, "id", "-u", env=UNPRIVILEGED)
    assert result.returncode == 0 and result.stdout.strip() == "1000", result.stderr[-2000:]
    _serve(Built(sif.job, sif.out, {**sif.data, "image": {**sif.data["image"], "ref": str(copy)}}), UNPRIVILEGED)


def _batch(inputs: Path, outputs: Path, run: list[str]) -> dict[str, Any]:
    result = subprocess.run([*run, "modak", "run", "--input", "/in", "--output", "/out", "--json", "--quiet"],
                            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _inputs(folder: Path, model: Path) -> dict[str, Any]:
    import numpy as np
    import onnx

    folder.mkdir()
    name = onnx.load(str(model), load_external_data=False).graph.input[0].name
    rng = np.random.default_rng(1)
    items = {f"item{i}": rng.standard_normal((n, 1, 28, 28)).astype(np.float32) for i, n in enumerate([1, 5, 70])}
    for stem, array in items.items():
        np.save(folder / f"{stem}.npy", array)
    return {"name": name, "items": items}


def test_batch_in_the_sif_and_the_docker_image_give_equal_outputs(sif: Built, tmp_path: Path) -> None:
    """The same plan as a Docker image and as a SIF: the same resolved environment (requirements lock), and over
    the same input files `modak run` writes equal outputs, both equal to ONNX Runtime's."""
    import numpy as np

    docker = build(EXAMPLE / "job.yaml", "-o", tmp_path / "docker", "--no-smoke")
    assert (tmp_path / "docker" / "requirements.lock").read_bytes() == (sif.out / "requirements.lock").read_bytes()
    assert docker["choice"] == sif.data["choice"]
    model = sif.out / "model" / "model.onnx"
    inputs = _inputs(tmp_path / "in", model)
    by_sif, by_docker = tmp_path / "out-sif", tmp_path / "out-docker"
    by_sif.mkdir()
    by_docker.mkdir()
    by_docker.chmod(0o777)  # the Docker image runs as uid 1000
    done = _batch(tmp_path / "in", by_sif, ["apptainer", "run", "--bind", f"{tmp_path / 'in'}:/in:ro",
                                           "--bind", f"{by_sif}:/out", sif.ref])
    assert (done["done"], done["skipped"]) == (3, 0)
    _batch(tmp_path / "in", by_docker, ["podman", "run", "--rm", "--network", "none", "-v",
                                        f"{tmp_path / 'in'}:/in:ro", "-v", f"{by_docker}:/out",
                                        docker["image"]["ref"]])
    for stem, array in inputs["items"].items():
        with np.load(by_sif / f"{stem}.npz") as a, np.load(by_docker / f"{stem}.npz") as b:
            assert a.files == b.files
            expected = _onnx_reference(model, {inputs["name"]: array})
            for key, reference in zip(a.files, expected):
                np.testing.assert_array_equal(a[key], b[key])
                np.testing.assert_allclose(a[key], reference, rtol=1e-3, atol=1e-4)


def test_the_sif_applies_the_allocations_threads(sif: Built) -> None:
    """The entrypoint sets the thread policy from the CPUs the run got (here one, as Slurm's SLURM_CPUS_PER_TASK
    says)."""
    result = apptainer("run", "--env", "SLURM_CPUS_PER_TASK=1", sif.ref, "modak", "self-test", timeout=900)
    report = parse_self_test(result.stdout)
    assert result.returncode == 0 and report and report["threads"] == 1, result.stderr[-2000:]


@pytest.mark.slurm
def test_slurm_runs_the_sif(sif: Built, tmp_path: Path) -> None:
    """A Slurm target whose engine is Apptainer: ``modak submit`` runs the job script's ``apptainer run`` of the
    SIF under the local Slurm, with the allocation's CPUs; the job's output is the self-test's JSON."""
    _require_slurm()
    target = write_target(tmp_path, "local-slurm-apptainer", container={"engine": "apptainer"},
                          scheduler={"kind": "slurm", "partition": "debug", "time_limit": "00:10:00"})
    out = tmp_path / "out"
    shutil.copytree(sif.out, out, ignore=shutil.ignore_patterns(".modak-build.lock"))
    job_script = modak("render", EXAMPLE / "job.yaml", "--target", target, "-o", out)
    assert job_script.returncode == 0, job_script.stderr
    script = (out / "job.sh").read_text()
    assert "#SBATCH --partition=debug" in script and 'apptainer run "$MODAK_SIF"' in script
    result = modak("submit", EXAMPLE / "job.yaml", "--target", target, "-o", out, "--wait", "600", "--json")
    assert result.returncode == 0, result.stderr
    submitted = json.loads(result.stdout)
    output = Path(submitted["output"])
    text = output.read_text() if output.exists() else "(no output file)"
    assert submitted["state"] == "COMPLETED" and submitted["exit_code"] == 0, text
    report = parse_self_test(text)
    assert report and report["status"] == "ok" and report["runtime"] == sif.data["choice"]["runtime"], text
    assert report["threads"] == 2  # the job's --cpus-per-task


def test_a_failed_sif_build_is_exit_5_and_leaves_no_sif(tmp_path: Path) -> None:
    folder = tmp_path / "spec"
    write_target(folder, "local-cpu", container={"engine": "apptainer"})
    job = write_job(folder, name="broken", entrypoint={"requirements": ["modak-no-such-package==0.0.1"]})
    out = tmp_path / "out"
    result = modak("build", job, "-o", out)
    assert result.returncode == EXIT_BUILD_FAILED, result.stderr
    assert "build failed: apptainer build exited with" in result.stderr and str(out / "build.log") in result.stderr
    assert "modak-no-such-package" in (out / "build.log").read_text()
    assert not list(out.glob("*.sif")) and not list(out.glob(".build.*")) and not (out / "base-image.tar").exists()


def test_an_unprivileged_user_builds_a_sif(readable: Path) -> None:
    """A build as uid 1000 (Apptainer's unprivileged build: a user namespace, as --fakeroot) from a definition file
    that bootstraps from a docker-archive."""
    tmp_path = readable
    base = tmp_path / "base.tar"
    saved = subprocess.run(["podman", "save", "--format", "docker-archive", "-o", str(base),
                            "localhost/debian-base:bookworm"], capture_output=True, text=True)
    assert saved.returncode == 0, saved.stderr
    (tmp_path / "x.def").write_text("Bootstrap: docker-archive\nFrom: base.tar\n\n%post\n    echo built > /built\n")
    base.chmod(0o644)
    result = apptainer("build", "--fakeroot", "--notest", "x.sif", "x.def", env=UNPRIVILEGED, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (tmp_path / "x.sif").stat().st_uid == 1000
    ran = apptainer("exec", tmp_path / "x.sif", "cat", "/built", env=UNPRIVILEGED)
    assert ran.returncode == 0 and ran.stdout.strip() == "built", ran.stderr


def test_the_sif_is_pushed_to_a_registry_as_an_oci_artifact_and_pulled_back(sif: Built) -> None:
    """``--push`` of a SIF: ``apptainer push`` to ``oras://`` plus the plan's reference on the registry that requires
    a login, the login from modak's environment variables; pulled back, its labels are the built ones; without the
    login, a clear error."""
    from modak.build.credentials import Credentials
    from modak.build.engines.base import BuildLog
    from modak.build.pipeline import push
    from modak.errors import PushFailed
    from tests.test_build import AUTH_PASSWORD, AUTH_REGISTRY, AUTH_USER

    engine = ApptainerEngine()
    ref = f"oras://{AUTH_REGISTRY}/modak/mnist-cnn:{Path(sif.ref).stat().st_mtime_ns}"
    labels = engine.inspect(sif.ref).labels
    with pytest.raises(PushFailed, match="401 Unauthorized.*MODAK_REGISTRY_USERNAME"):
        push(engine, sif.ref, ref, labels)
    login = Credentials(AUTH_REGISTRY, AUTH_USER, AUTH_PASSWORD, "the environment")
    log_file = sif.out / "push.log"
    log = BuildLog(log_file)
    engine.push(sif.ref, ref, log, login)
    log.close()
    assert AUTH_PASSWORD not in log_file.read_text()
    push(engine, sif.ref, ref, labels, login)  # pushed again, pulled back, the labels compared
    assert engine.pull(ref, login).labels == labels


def test_a_podman_build_converted_to_a_sif_keeps_the_images_labels(tmp_path: Path) -> None:
    """``modak build --sif`` on a Podman target: the smoke-tested image, converted by Apptainer from its
    docker-archive into OUT/<job name>.sif (compressed as the target's ``container.sif_compression`` says, here
    gzip-fast), carries the image's labels (the lock's included) and runs the plan's runtime; asked of an Apptainer
    build, it is exit 2."""
    folder = tmp_path / "spec"
    write_target(folder, "local-cpu", container={"sif_compression": "gzip-fast"})
    out = tmp_path / "out"
    data = build(write_job(folder), "-o", out, "--sif")
    sif_file = Path(data["sif"])
    assert sif_file == out / "mnist-cnn.sif" and sif_file.is_file() and str(sif_file) in data["artifacts"]
    assert " --mksquashfs-args '-comp gzip -Xcompression-level 1' --notest" in (out / "sif.log").read_text()
    assert not list(out.glob("*.tar")) and not list(out.glob(".*.tar")) and not list(out.glob(".build.*"))
    labels = ApptainerEngine().inspect(str(sif_file)).labels
    assert data["image"]["labels"].items() <= labels.items() and LOCK_LABEL in labels
    result = apptainer("run", sif_file, "modak", "self-test", timeout=900)
    report = parse_self_test(result.stdout)
    assert result.returncode == 0 and report and report["runtime"] == data["choice"]["runtime"], result.stderr
    refused = modak("build", EXAMPLE / "job.yaml", "-o", tmp_path / "again", "--engine", "apptainer", "--sif")
    assert refused.returncode == 2 and "a SIF already" in refused.stderr
