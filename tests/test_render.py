"""Rendering: golden files per template family, the spython round trip, hostile strings, the entrypoint's
thread computation and atomic output.

Plans come from the real pipeline (spec loading, model resolution, analysis, ranking) on a tiny hand-built
ONNX graph; a predictor that prefers one candidate keeps each case's choice independent of the recipes' priors.
Regenerate the golden files with ``MODAK_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import zipfile
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from spython.main.parse.parsers import SingularityParser

import modak
import modak.render.render as render_module
from modak.api import load as load_job
from modak.errors import EXIT_BAD_INPUT, InputError
from modak.paths import data_dir
from modak.plan import Plan, make_plan
from modak.predict.base import Prediction
from modak.render.ir import BuildDescription, build_description
from modak.render.package import source_digest
from modak.render.render import OUTPUTS, render
from modak.spec.loader import LoadedJob
from modak.spec.models import DataSpec
from modak.spec.resolve import resolve_files
from modak.workload.analysis import analyze
from modak.workload.source import ModelSource, load_analysis
from tests.support.onnx_graphs import write_onnx

GOLDEN = Path(__file__).parent / "golden"
CREATED = "2025-01-01T00:00:00Z"
GOLDEN_VERSION = "0.0.0+golden"  # the modak version the golden files are rendered as
FAMILIES = ("Dockerfile", "Singularity.def", "entrypoint.sh", "job.sh")
HOSTILE = ["$(touch PWNED)", "`touch PWNED`", "it's \"quoted\"", "two\nlines", "{{ 7*7 }}", "{% raw %}x{% endraw %}",
           "back\\slash", "${HOME}", "From: evil %post"]


@dataclass(frozen=True)
class Preferred:
    """A predictor that makes one candidate (runtime, device, precision, parameter values) the fastest."""

    runtime: str
    device: str
    precision: str
    params: tuple[tuple[str, Any], ...] = ()
    name: str = "fixed"

    def predict(self, workload: Any, ceilings: Any, candidate: Any, recipe: Any) -> Prediction:
        hit = (candidate.runtime, candidate.device, candidate.precision.value) == \
            (self.runtime, self.device, self.precision) and all(candidate.param(k) == v for k, v in self.params)
        step = 0.002 if hit else 0.004
        terms = (("compute_s", step * 0.6), ("memory_s", step * 0.3), ("overhead_s", step * 0.1))
        return Prediction(step, step / 2, step * 2, 0.0, terms, "compute", self.name)


def make_plan_for(folder: Path, job: dict[str, Any], target: dict[str, Any], prefer: Preferred,
                  zoo: str | None = None) -> tuple[Plan, ModelSource]:
    """Write the specs to ``folder`` and plan them; ``zoo`` stands the tiny graph in for that zoo model."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.yaml").write_text(yaml.safe_dump({"apiVersion": "modak/v1", "kind": "Job", **job}))
    (folder / "target.yaml").write_text(yaml.safe_dump({"apiVersion": "modak/v1", "kind": "Target", **target}))
    loaded = load_job(folder / "job.yaml")
    if zoo:
        source = ModelSource(zoo, folder / "model.onnx", {"x": [4]}, zoo)
        workload = analyze(source.onnx_path, loaded.job.model.batch_size, source.input_shapes, loaded.job.task,
                           name=zoo)
    else:
        source, workload = load_analysis(loaded)
    return make_plan(loaded, source, workload, predictor=prefer), source


def slurm_case(folder: Path) -> tuple[Plan, ModelSource]:
    """CPU, Podman, Slurm; user files, requirements, data, a site index, CA bundle, wheelhouse, mirror."""
    write_onnx(folder / "model.onnx", external=True)
    (folder / "serve.py").write_text("print('serving')\n")
    (folder / "conf").mkdir()
    (folder / "conf" / "settings.toml").write_text("port = 8080\n")
    (folder / "certs").mkdir()
    (folder / "certs" / "proxy.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (folder / "wheelhouse").mkdir()
    (folder / "wheelhouse" / "internal_tool-1.0-py3-none-any.whl").write_bytes(b"PK")
    job = {"name": "resnet-serving", "target": "target.yaml", "task": "inference",
           "model": {"onnx": "model.onnx", "batch_size": 8}, "constraints": {"runtimes": ["onnxruntime"]},
           "entrypoint": {"command": ["python3", "serve.py", "--port", "8080"],
                          "requirements": ["fastapi==0.115.0", "uvicorn >= 0.30"], "files": ["serve.py", "conf"]},
           "data": {"location": "/scratch/datasets/imagenet", "mount": "/data", "output": "/scratch/results/resnet"}}
    target = {"name": "hpc-cpu", "cpu": {"microarchitecture": "icelake", "sockets": 2, "cores_per_socket": 16},
              "memory": {"size_gb": 256},
              "scheduler": {"kind": "slurm", "partition": "cpu", "account": "ml-team", "qos": "normal",
                            "time_limit": "02:00:00"},
              "container": {"engine": "podman", "registry": "registry.example.org/ml",
                            "base_images": {"debian": "mirror.example.org/library/debian:bookworm-slim"}},
              "python": {"index_url": "https://pypi.example.org/simple",
                         "extra_index_urls": ["https://extra.example.org/simple"],
                         "ca_bundle": "certs/proxy.crt", "wheelhouse": "wheelhouse"}}
    prefer = Preferred("onnxruntime", "cpu", "fp32", (("threads", "half"), ("allocator", "jemalloc"),
                                                      ("graph_optimization", "all")))
    return make_plan_for(folder, job, target, prefer)


def pbs_case(folder: Path) -> tuple[Plan, ModelSource]:
    """GPU, Docker, PBS, the default CUDA base image; batch inference from a data set into a results folder."""
    write_onnx(folder / "model.onnx")
    job = {"name": "bert-gpu", "target": "target.yaml", "task": "inference", "device": "gpu",
           "precision": ["fp16", "fp32"], "model": {"onnx": "model.onnx", "batch_size": 32},
           "constraints": {"runtimes": ["onnxruntime"]},
           "data": {"location": "/lustre/tokens", "mount": "/in", "output": "/lustre/results/bert",
                    "output_mount": "/out"}}
    target = {"name": "gpu-node", "cpu": {"microarchitecture": "zen3", "cores_per_socket": 32},
              "memory": {"size_gb": 512}, "gpus": {"model": "H100", "count": 4},
              "scheduler": {"kind": "pbs", "partition": "gpuq", "account": "proj42", "time_limit": "1-12:00:00"},
              "container": {"engine": "docker"}}
    prefer = Preferred("onnxruntime", "gpu", "fp16", (("graph_optimization", "all"),))
    return make_plan_for(folder, job, target, prefer)


def bash_case(folder: Path) -> tuple[Plan, ModelSource]:
    """A zoo model for a torch-format runtime, training, Apptainer, no scheduler."""
    write_onnx(folder / "model.onnx")
    job = {"name": "mlp-train", "target": "target.yaml", "task": "training", "model": {"zoo": "mlp", "batch_size": 64},
           "constraints": {"runtimes": ["pytorch"]},
           "data": {"location": "/home/user/data", "mount": "/data", "output": "/home/user/checkpoints"}}
    target = {"name": "workstation", "cpu": {"microarchitecture": "skylake_avx512", "cores_per_socket": 8},
              "memory": {"size_gb": 64}, "container": {"engine": "apptainer"}}
    prefer = Preferred("pytorch", "cpu", "fp32", (("threads", "all"), ("allocator", "default")))
    return make_plan_for(folder, job, target, prefer, zoo="mlp")


CASES = {"slurm": slurm_case, "pbs": pbs_case, "bash": bash_case}


@dataclass(frozen=True)
class Rendered:
    plan: Plan
    source: ModelSource
    ir: BuildDescription
    out: Path

    def text(self, name: str) -> str:
        return (self.out / name).read_text()


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendered]:
    """The golden cases, rendered as modak :data:`GOLDEN_VERSION` so that a version bump changes no golden file."""
    results = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modak, "__version__", GOLDEN_VERSION)
        patch.delenv("MODAK_TEMPLATES", raising=False)
        for case, make in CASES.items():
            folder = tmp_path_factory.mktemp(case)
            plan, source = make(folder / "spec")
            ir = build_description(plan, CREATED)
            render(ir, folder / "out")
            results[case] = Rendered(plan, source, ir, folder / "out")
    return results


def _normalized(text: str, plan: Plan) -> str:
    """The text with the plan digest and the in-image package's replaced: they change with every predictor,
    recipe or in-image code edit elsewhere."""
    digest = plan.digest()
    return (text.replace(digest, "<plan-digest>").replace(digest[:12], "<digest12>")
            .replace(source_digest(), "<runtime-digest>"))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", FAMILIES)
def test_golden(rendered: dict[str, Rendered], case: str, name: str) -> None:
    result = rendered[case]
    actual = _normalized(result.text(name), result.plan)
    golden = GOLDEN / case / name
    if os.environ.get("MODAK_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(actual)
    assert golden.is_file(), f"missing golden file {golden}; create it with MODAK_UPDATE_GOLDEN=1"
    assert actual == golden.read_text(), f"{case}/{name} differs from {golden}; regenerate with MODAK_UPDATE_GOLDEN=1"


def test_build_context_is_complete(rendered: dict[str, Rendered]) -> None:
    slurm = rendered["slurm"]
    out = slurm.out
    assert {p.name for p in out.iterdir()} == {*OUTPUTS, ".dockerignore", "modak-wheel", "model", "app", "wheels",
                                               "ca.crt"}
    ignore = (out / ".dockerignore").read_text().splitlines()
    assert "*" in ignore and {f"!{p.name}" for p in out.iterdir() if p.name != ".dockerignore"} <= set(ignore)
    assert sorted(p.name for p in (out / "model").iterdir()) == ["model.onnx", "model.onnx.data"]
    assert (out / "app" / "serve.py").is_file() and (out / "app" / "conf" / "settings.toml").is_file()
    assert (out / "wheels" / "internal_tool-1.0-py3-none-any.whl").is_file()
    with zipfile.ZipFile(out / slurm.ir.runtime_wheel) as wheel:
        names = wheel.namelist()
        entry_points = wheel.read(next(n for n in names if n.endswith("dist-info/entry_points.txt"))).decode()
    shipped = {n.split("/")[1] for n in names if n.startswith("modak/")}
    assert shipped == {"__init__.py", "errors.py", "paths.py", "image", "runtime"}  # the in-image code only
    assert "modak/runtime/cli.py" in names and not any("__pycache__" in n for n in names)
    assert "modak = modak.runtime.cli:main" in entry_points
    for name in ("entrypoint.sh", "job.sh"):
        assert (out / name).stat().st_mode & 0o777 == 0o755
    plan = json.loads(slurm.text("plan.json"))
    assert plan == json.loads(json.dumps(slurm.plan.to_dict()))
    for result in rendered.values():
        for name in ("entrypoint.sh", "job.sh"):
            subprocess.run(["bash", "-n", str(result.out / name)], check=True)
    env, deployment = dict(rendered["slurm"].ir.env), plan["deployment"]
    assert deployment["env"] == {"MODAK_PRELOAD": "libjemalloc.so.2"} and "libjemalloc2" in slurm.ir.apt_packages
    assert deployment["params"]["threads"] == "half" and env["MODAK_MODEL"] == "/opt/modak/model/model.onnx"
    assert env["MODAK_PLAN"] == "/opt/modak/plan.json"
    assert env["CFLAGS"] == env["CXXFLAGS"] == "-march=icelake-client -mtune=icelake-client"
    assert json.loads(rendered["bash"].text("plan.json"))["deployment"]["zoo"] == "mlp"
    assert rendered["pbs"].ir.base.ref.startswith("docker.io/nvidia/cuda:")
    assert slurm.ir.image.ref.startswith("registry.example.org/ml/resnet-serving:onnxruntime-")


def _post_commands(ir: BuildDescription) -> list[list[str]]:
    build_dir = ir.def_build_dir
    assignments = [f"{k}={v}" for k, v in ir.build_env + ir.pip.env(build_dir)]
    apt = ["apt-get", "-o", "APT::Sandbox::User=root"]
    lock_digest = f"sha256:$(sha256sum {ir.lock_file} | cut -d ' ' -f 1)"
    commands = [["set", "-eu"], ["export", "DEBIAN_FRONTEND=noninteractive"], [*apt, "update"],
                [*apt, "install", "-y", "--no-install-recommends", *ir.apt_packages],
                ["rm", "-rf", "/var/lib/apt/lists/*"], ["python3", "-m", "venv", ir.venv],
                [*assignments, *ir.pip.argv(build_dir)], ["mkdir", "-p", str(Path(ir.lock_file).parent)],
                [f"{ir.venv}/bin/pip", "freeze", "--all", "--disable-pip-version-check", ">", ir.lock_file],
                ["echo", f"{ir.lock_label} {lock_digest}", ">>", "${APPTAINER_LABELS:-$SINGULARITY_LABELS}"],
                list(ir.runtime_install(build_dir)), ["mkdir", "-p", ir.workdir]]
    return commands + [["rm", "-rf", build_dir]]


@pytest.mark.parametrize("case", CASES)
def test_spython_round_trip(rendered: dict[str, Rendered], case: str) -> None:
    result = rendered[case]
    ir = result.ir
    parser = SingularityParser(str(result.out / "Singularity.def"))
    recipe = parser.recipe[parser.active_layer]
    assert recipe.fromHeader == ir.base.ref
    environment = {}
    for line in recipe.environ:
        name, _, value = line.partition("=")
        environment[name] = shlex.split(value)[0]
    assert environment == {**dict(ir.env), "PATH": f"{ir.path_prepend}:$PATH"}
    files = [(c.source, c.destination) for c in ir.copies]
    files += [(path, f"{ir.def_build_dir}/{path}") for path in (*ir.pip.mounts(), ir.runtime_wheel)]
    assert [tuple(line.split()) for line in recipe.files] == files
    *post, test, executable = [shlex.split(line) for line in recipe.install]  # spython appends %test to %post
    assert post == _post_commands(ir)
    assert test == ["echo", shlex.join(["cd", ir.workdir, "&&", "exec", ir.entrypoint, *ir.self_test])
                    .replace("'&&'", "&&"), ">>", "/tests.sh"] and executable == ["chmod", "u+x", "/tests.sh"]
    assert dict(line.split(" ", 1) for line in recipe.labels) == dict(ir.labels)
    assert shlex.split(recipe.cmd) == ["cd", ir.workdir, "&&", "exec", ir.entrypoint, "$@"]


def test_dockerfile_matches_description(rendered: dict[str, Rendered]) -> None:
    ir = rendered["slurm"].ir
    text = rendered["slurm"].text("Dockerfile")
    lines = text.splitlines()
    assert f"FROM {ir.base.ref}" in lines
    assert json.loads(next(line for line in lines if line.startswith("CMD "))[4:]) == list(ir.command)
    assert "ENTRYPOINT [\"/opt/modak/entrypoint.sh\"]" in lines and "USER modak" in lines
    assert "--mount=type=bind,source=ca.crt,target=/run/modak/ca.crt" in text
    assert "PIP_CERT=/run/modak/ca.crt /opt/venv/bin/pip install" in text
    assert "COPY [\"ca.crt\"" not in text and "COPY [\"wheels\"" not in text
    order = [text.index(marker) for marker in ("apt-get install", "pip install", "--no-deps --no-index", '"model"',
                                               '"entrypoint.sh"', '"plan.json"', '"app"', "LABEL ")]
    assert order == sorted(order)
    assert _docker_env(text)["MODAK_PLAN"] == dict(ir.env)["MODAK_PLAN"]


def _fake_engine(folder: Path, name: str) -> dict[str, str]:
    """An environment whose ``name`` command prints its arguments NUL-separated instead of running anything."""
    fake = folder / "bin" / name
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\nprintf '%s\\0' \"$@\"\n")
    fake.chmod(0o755)
    return {"PATH": f"{fake.parent}:{os.environ['PATH']}"}


@pytest.mark.parametrize("sif", [None, "/images/custom.sif"])
def test_apptainer_job_script(rendered: dict[str, Rendered], tmp_path: Path, sif: str | None) -> None:
    output = tmp_path / "my results"
    env = _fake_engine(tmp_path, "apptainer") | {"MODAK_OUTPUT": str(output)} | ({"MODAK_SIF": sif} if sif else {})
    result = subprocess.run([str(rendered["bash"].out / "job.sh"), "python3", "x.py"], env=env, cwd=tmp_path,
                            capture_output=True, check=True)
    assert result.stdout.decode().split("\0")[:-1] == ["run", "--bind", "/home/user/data:/data:ro",
                                                       "--bind", f"{output}:/output", sif or "mlp-train.sif",
                                                       "python3", "x.py"]
    assert output.is_dir()  # created for the results


@pytest.mark.parametrize("who", ["root", "root, existing folder", "user", "user of rootless Docker"])
def test_a_docker_job_script_gives_the_results_folder_to_the_container_user(
        rendered: dict[str, Rendered], tmp_path: Path, who: str) -> None:
    """Docker, batch inference by default: the data read-only, the results folder read-write. Started by root, the
    image keeps its own user, which gets a folder the script creates (never one that was there); started by a
    user, the container runs as that user; under rootless Docker, as the container's root, which is that user."""
    output = tmp_path / "results"
    if who == "root, existing folder":
        output.mkdir()
    env = _fake_engine(tmp_path, "docker") | {"MODAK_OUTPUT": str(output)}
    if who == "user of rootless Docker":  # what `docker info` says of a rootless daemon
        (tmp_path / "bin" / "docker").write_text(
            "#!/bin/sh\nif [ \"$1\" = info ]; then echo '[name=seccomp,profile=builtin name=rootless]'; exit; fi\n"
            "printf '%s\\0' \"$@\"\n")
    fake_id = tmp_path / "bin" / "id"
    uid = 0 if who.startswith("root") else 4242
    fake_id.write_text(f"#!/bin/sh\ncase \"$1\" in -u) echo {uid};; -g) echo 100;; esac\n")
    fake_id.chmod(0o755)
    chown = tmp_path / "bin" / "chown"  # records what the script gives the image's user
    chown.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'chowned'}\n")
    chown.chmod(0o755)
    result = subprocess.run(["bash", str(rendered["pbs"].out / "job.sh")], env=env, cwd=tmp_path,
                            capture_output=True, check=True)
    argv = result.stdout.decode().split("\0")[:-1]
    ir = rendered["pbs"].ir
    user = {"user": ["--user", "4242:100"], "user of rootless Docker": ["--user", "0:0"]}.get(who, [])
    tail = ["-v", "/lustre/tokens:/in:ro", *user, "-v", f"{output}:/out", ir.image.ref,
            "modak", "run", "--input", "/in", "--output", "/out"]
    assert argv[-len(tail):] == tail, argv
    assert output.is_dir()
    chowned = (tmp_path / "chowned").read_text().split() if (tmp_path / "chowned").exists() else None
    assert chowned == ([str(ir.uid), "--", str(output)] if who == "root" else None)


@pytest.mark.parametrize("env, gpus", [
    ({}, ["--gpus", "all"]),  # no allocation seen: the node's GPUs
    ({"CUDA_VISIBLE_DEVICES": "GPU-1a,GPU-2b"}, ["--gpus", '"device=GPU-1a,GPU-2b"']),  # PBS's cgroup hook
    ({"CUDA_VISIBLE_DEVICES": "0", "MODAK_GPUS": "3"}, ["--gpus", '"device=3"']),
])
def test_a_docker_job_script_gives_the_container_the_allocated_gpus(
        rendered: dict[str, Rendered], tmp_path: Path, env: dict[str, str], gpus: list[str]) -> None:
    """A container engine's containers do not inherit the job's device limits: the script passes the GPUs the
    scheduler allocated, not all of the node's."""
    run = subprocess.run(["bash", str(rendered["pbs"].out / "job.sh")], cwd=tmp_path, capture_output=True,
                         check=True, env=_fake_engine(tmp_path, "docker") | {"MODAK_OUTPUT": str(tmp_path / "o")} | env)
    argv = run.stdout.decode().split("\0")[:-1]
    assert argv[argv.index("--gpus"):argv.index("--gpus") + 2] == gpus and argv.count("--gpus") == 1, argv


def test_a_slurm_podman_job_script_gives_the_container_the_allocated_gpus(tmp_path: Path) -> None:
    write_onnx(tmp_path / "spec" / "model.onnx")
    job = {"name": "gpu-job", "target": "target.yaml", "task": "inference", "device": "gpu",
           "model": {"onnx": "model.onnx", "batch_size": 8}, "constraints": {"runtimes": ["onnxruntime"]}}
    target = {"name": "gpu-node", "cpu": {"microarchitecture": "zen3", "cores_per_socket": 32},
              "memory": {"size_gb": 512}, "gpus": {"model": "H100", "count": 2},
              "scheduler": {"kind": "slurm"}, "container": {"engine": "podman"}}
    plan, _ = make_plan_for(tmp_path / "spec", job, target, Preferred("onnxruntime", "gpu", "fp32"))
    render(build_description(plan, CREATED), tmp_path / "out")
    assert "#SBATCH --gres=gpu:2" in (tmp_path / "out" / "job.sh").read_text()

    def devices(env: dict[str, str]) -> list[str]:
        run = subprocess.run(["bash", str(tmp_path / "out" / "job.sh")], cwd=tmp_path, capture_output=True,
                             check=True, env=_fake_engine(tmp_path, "podman") | env)
        argv = run.stdout.decode().split("\0")[:-1]
        return [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]

    assert devices({}) == ["nvidia.com/gpu=all"]
    # Slurm's global GPU indexes, not CUDA_VISIBLE_DEVICES (renumbered from 0 where Slurm constrains devices)
    assert devices({"SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1"}) == ["nvidia.com/gpu=1", "nvidia.com/gpu=3"]


def _docker_env(text: str) -> dict[str, str]:
    """The ENV values of a rendered Dockerfile, unescaped as Docker reads double-quoted strings."""
    values = {}
    for name, quoted in re.findall(r'^(?:ENV |    )([A-Z_]+)="((?:[^"\\]|\\.)*)"', text, re.MULTILINE):
        values[name] = re.sub(r'\\(["$\\])', r"\1", quoted)
    return values


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """A job whose free text (command, file names, data path, model path and input name) is hostile."""
    root = tmp_path_factory.mktemp("hostile")
    folder = root / "spec"
    bad = "".join(HOSTILE).replace("/", "_")
    model = Path(f"m {bad}") / f"model {bad.replace(chr(92), '_')}.onnx"  # onnx reads a backslash as a separator
    write_onnx(folder / model, input_name=f"x{bad}", external=True)
    (folder / bad).write_text("user file\n")
    job = {"name": "hostile", "target": "target.yaml", "task": "inference",
           "model": {"onnx": str(model), "batch_size": 2}, "constraints": {"runtimes": ["onnxruntime"]},
           "entrypoint": {"command": ["printf", "%s\\0", *HOSTILE], "files": [bad]},
           "data": {"location": "/data/" + bad.replace(":", "_"), "mount": "/data"}}
    target = {"name": "lab", "cpu": {"microarchitecture": "zen4", "cores_per_socket": 2}, "memory": {"size_gb": 8},
              "scheduler": {"kind": "slurm"}, "container": {"engine": "podman"}}
    plan, source = make_plan_for(folder, job, target, Preferred("onnxruntime", "cpu", "fp32"))
    ir = build_description(plan, CREATED)
    render(ir, root / "out")
    return Rendered(plan, source, ir, root / "out")


def test_hostile_strings_stay_data(hostile: Rendered, tmp_path: Path) -> None:
    out, argv = hostile.out, ["printf", "%s\\0", *HOSTILE]
    for name in ("entrypoint.sh", "job.sh"):
        subprocess.run(["bash", "-n", str(out / name)], check=True)
    env = {**_launcher(out), "MODAK_CGROUP_ROOT": str(tmp_path)}
    default = subprocess.run([str(out / "entrypoint.sh")], env=env, cwd=tmp_path, capture_output=True, check=True)
    assert default.stdout.decode().split("\0")[:-1] == HOSTILE
    given = subprocess.run([str(out / "entrypoint.sh"), *argv], env=env, cwd=tmp_path, capture_output=True,
                           check=True)
    assert given.stdout.decode().split("\0")[:-1] == HOSTILE

    job = subprocess.run([str(out / "job.sh"), "extra arg"], env=env | _fake_engine(tmp_path, "podman"),
                         cwd=tmp_path, capture_output=True, check=True)
    bind = f"{hostile.plan.loaded.job.data.location}:/data:ro"
    assert job.stdout.decode().split("\0")[:-1] == ["run", "--rm", "-e", "SLURM_CPUS_PER_TASK", "-e", "NCPUS",
                                                    "-v", bind, hostile.ir.image.ref, "extra arg"]
    assert not list(tmp_path.rglob("PWNED")) and not list(out.parent.rglob("PWNED"))

    dockerfile = (out / "Dockerfile").read_text()
    cmd = [line for line in dockerfile.splitlines() if line.startswith("CMD ")]
    assert len(cmd) == 1 and json.loads(cmd[0][4:]) == argv
    shapes = {f"x{''.join(HOSTILE).replace('/', '_')}": [4]}
    assert json.loads((out / "plan.json").read_text())["deployment"]["input_shapes"] == shapes
    for path in out.rglob("*"):
        if path.is_file() and "modak-wheel" not in path.parts:
            text = _normalized(path.read_text(errors="replace"), hostile.plan)
            assert not re.search(r"(?<![\w.])49(?![\w.])", text), f"{path.name} evaluated a template expression"

    definition = (out / "Singularity.def").read_text()
    assert "{{" not in definition and "}}" not in definition
    parser = SingularityParser(str(out / "Singularity.def"))
    recipe = parser.recipe[parser.active_layer]
    assert recipe.fromHeader == hostile.ir.base.ref
    environment = {line.partition("=")[0]: shlex.split(line.partition("=")[2])[0] for line in recipe.environ}
    assert environment["MODAK_PLAN"] == "/opt/modak/plan.json"
    assert sorted(p.name for p in (out / "app").iterdir()) == [hostile.plan.loaded.job.entrypoint.files[0]]


@pytest.mark.parametrize("which, loc, value", [
    ("job", ("name",), "x$(touch PWNED)"),
    ("job", ("name",), "two\nlines"),
    ("job", ("data", "mount"), "/data'`touch PWNED`"),
    ("job", ("entrypoint", "requirements", 0), "numpy; touch PWNED"),
    ("target", ("scheduler", "partition"), "debug --wrap='touch PWNED'"),
    ("target", ("scheduler", "account"), "{{ 7*7 }}"),
    ("target", ("container", "registry"), "registry.example.org/$(touch PWNED)"),
    ("target", ("container", "base_images", "debian"), "debian:{% raw %}"),
])
def test_spec_rejects_hostile_constrained_fields(tmp_path: Path, which: str, loc: tuple, value: str) -> None:
    specs = {"job": {"apiVersion": "modak/v1", "kind": "Job", "name": "ok", "target": "target.yaml",
                     "task": "inference", "model": {"onnx": "model.onnx"},
                     "entrypoint": {"requirements": ["numpy"]}, "data": {"location": "/d"}},
             "target": {"apiVersion": "modak/v1", "kind": "Target", "name": "lab",
                        "cpu": {"microarchitecture": "zen4", "cores_per_socket": 2}, "memory": {"size_gb": 8}}}
    node = specs[which]
    for key in loc[:-1]:
        node = node.setdefault(key, {})
    node[loc[-1]] = value
    for name, spec in specs.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(InputError) as error:
        load_job(tmp_path / "job.yaml")
    assert error.value.exit_code == EXIT_BAD_INPUT
    assert error.value.field == ".".join(map(str, loc))
    assert error.value.file == str(tmp_path / f"{which}.yaml") and error.value.line


def _launcher(out: Path) -> dict[str, str]:
    """What a rendered entrypoint needs outside its image: the in-image package (the wheel, importable as a zip)
    and the plan it applies."""
    wheel = next((out / "modak-wheel").glob("*.whl"))
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(wheel), "MODAK_PLAN": str(out / "plan.json")}


def _threads(script: Path, cgroup: Path, env: dict[str, str], *command: str,
             check: bool = True) -> subprocess.CompletedProcess[str]:
    command = command or ("printenv", "MODAK_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                          "TVM_NUM_THREADS")
    return subprocess.run([str(script), *command], env={**_launcher(script.parent), "MODAK_CGROUP_ROOT": str(cgroup),
                                                        **env}, capture_output=True, text=True, check=check)


NPROC = None  # expected: the CPUs `nproc` reports
HALF_NPROC = -1  # expected: half of them (the slurm case's plan chose the policy "half")


@pytest.mark.parametrize("env, cgroup, expected", [
    ({"SLURM_CPUS_PER_TASK": "3", "MODAK_THREADS_POLICY": "half"}, {}, 1),
    ({"SLURM_CPUS_PER_TASK": "3", "MODAK_THREADS_POLICY": "all"}, {}, 3),
    ({"SLURM_CPUS_PER_TASK": "3", "MODAK_THREADS_POLICY": "8"}, {}, 3),
    ({"SLURM_CPUS_PER_TASK": "3", "MODAK_THREADS_POLICY": "2"}, {}, 2),
    ({"SLURM_CPUS_PER_TASK": "3"}, {"cpu.max": "100000 100000\n"}, 1),  # the plan's policy: half
    ({"NCPUS": "6", "MODAK_THREADS_POLICY": "half"}, {}, 3),
    ({"MODAK_THREADS_POLICY": "all"}, {"cpu.max": "200000 100000\n"}, 2),
    ({"MODAK_THREADS_POLICY": "all"}, {"cpu.max": "50000 100000\n"}, 1),
    ({"MODAK_THREADS_POLICY": "all"}, {"cpu.max": "max 100000\n"}, NPROC),
    ({"MODAK_THREADS_POLICY": "all"}, {"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),
    ({"MODAK_THREADS_POLICY": "all"}, {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, NPROC),
    ({}, {}, HALF_NPROC),
])
def test_entrypoint_threads(rendered: dict[str, Rendered], tmp_path: Path, env: dict[str, str],
                            cgroup: dict[str, str], expected: int | None) -> None:
    for name, content in cgroup.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    nproc = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    expected = {NPROC: nproc, HALF_NPROC: max(1, nproc // 2)}.get(expected, expected)
    result = _threads(rendered["slurm"].out / "entrypoint.sh", tmp_path, env)
    assert result.stdout.split() == [str(expected)] * 5
    assert result.stderr == ""


def test_entrypoint_preload_and_verbose(rendered: dict[str, Rendered], tmp_path: Path) -> None:
    out = rendered["slurm"].out
    script = out / "entrypoint.sh"
    plan = json.loads((out / "plan.json").read_text())
    plan["deployment"]["env"] = {"MODAK_PRELOAD": "libmodak-missing.so.1"}
    (tmp_path / "missing.json").write_text(json.dumps(plan))
    missing = _threads(script, tmp_path, {"MODAK_PLAN": str(tmp_path / "missing.json")}, "true", check=False)
    assert missing.returncode == 3 and "libmodak-missing.so.1, which is not installed" in missing.stderr
    plan["deployment"]["env"] = {"MODAK_PRELOAD": "libc.so.6", "XLA_FLAGS": "--x"}
    (tmp_path / "found.json").write_text(json.dumps(plan))
    found = _threads(script, tmp_path, {"MODAK_PLAN": str(tmp_path / "found.json"), "SLURM_CPUS_PER_TASK": "3",
                                        "MODAK_VERBOSE": "1"}, "printenv", "LD_PRELOAD", "XLA_FLAGS", "MODAK_PRELOAD",
                     check=False)
    library, flags = found.stdout.split()
    assert library.startswith("/usr/lib") and library.endswith("/libc.so.6") and Path(library).exists()
    assert flags == "--x"  # MODAK_PRELOAD itself is not exported: printenv fails on it
    assert found.stderr == ("modak: 3 CPUs (SLURM_CPUS_PER_TASK), threads policy half: 1 threads, "
                            f"LD_PRELOAD={library}\n")


def _without_default_bases(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "recipes").mkdir()
    (folder / "recipes" / "base_images.yaml").write_text(
        yaml.safe_dump({"cuda": {"image": "docker.io/nvidia/cuda:12.6.3-runtime-ubuntu24.04", "gcc": "13.2"}}))
    shutil.copy(data_dir("recipes") / "image.yaml", folder / "recipes" / "image.yaml")
    monkeypatch.setattr("modak.spec.loader.data_dir", lambda kind: folder / kind)


@pytest.mark.parametrize("change, field", [
    (lambda folder: (folder / "certs" / "proxy.crt").unlink(), "python.ca_bundle"),
    (lambda folder: (folder / "wheelhouse" / "internal_tool-1.0-py3-none-any.whl").unlink(), "python.wheelhouse"),
    (lambda folder: (folder / "model.onnx.data").unlink(), "model.onnx"),
    (lambda folder: shutil.rmtree(folder / "conf"), "entrypoint.files.1"),
])
def test_unusable_build_inputs_are_rejected_when_loading(tmp_path: Path, change: Any, field: str) -> None:
    """What the build would need is checked by the resolve step, so `modak plan` rejects it already."""
    slurm_case(tmp_path)
    change(tmp_path)
    with pytest.raises(InputError) as error:
        load_analysis(load_job(tmp_path / "job.yaml"))
    assert error.value.field == field and error.value.exit_code == EXIT_BAD_INPUT


def test_compiler_flags_follow_the_base_images_gcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-march comes from the gcc of the base image (recipes/base_images.yaml), not from one gcc for all images."""
    plan, source = slurm_case(tmp_path)  # icelake, on the debian base (mapped to a mirror by the target)
    flags = dict(build_description(plan, CREATED).build_env)["CFLAGS"]
    assert flags == "-march=icelake-client -mtune=icelake-client"
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "base_images.yaml").write_text(
        yaml.safe_dump({"debian": {"image": "docker.io/library/debian:stretch-slim", "gcc": "6.3"}}))
    shutil.copy(data_dir("recipes") / "image.yaml", tmp_path / "recipes" / "image.yaml")
    monkeypatch.setattr("modak.spec.loader.data_dir", lambda kind: tmp_path / kind)
    assert build_description(plan, CREATED).build_env == ()  # gcc 6.3 does not know icelake


def _site_target(folder: Path, templates: str) -> LoadedJob:
    """The job of ``folder`` again, its target now naming ``templates`` as its site templates."""
    target = yaml.safe_load((folder / "target.yaml").read_text())
    target["container"]["templates"] = templates
    (folder / "target.yaml").write_text(yaml.safe_dump(target))
    return load_job(folder / "job.yaml")


def _write_templates(folder: Path, templates: dict[str, str]) -> None:
    for name, text in templates.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_site_templates_override_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A site template extends modak's and overrides one block; the target's folder comes before
    $MODAK_TEMPLATES, whose templates apply where the target's folder has none."""
    plan, source = pbs_case(tmp_path / "spec")
    render(build_description(plan, CREATED), tmp_path / "shipped")
    _write_templates(tmp_path / "spec" / "site", {"dockerfile/Dockerfile.j2": (
        '{% extends "modak/dockerfile/Dockerfile.j2" %}\n'
        "{% block system %}\n{{ super() -}}\nRUN printf '%s\\n' {{ ir.summary | sh }} > /etc/modak-job\n"
        "{% endblock %}\n")})
    _write_templates(tmp_path / "env", {
        "dockerfile/Dockerfile.j2": "FROM shadowed\n",
        "jobscript/pbs.sh.j2": ('{% extends "modak/jobscript/pbs.sh.j2" %}\n'
                                "{% block directives %}\n{{ super() -}}\n#PBS -l place=excl\n{% endblock %}\n")})
    monkeypatch.setenv("MODAK_TEMPLATES", str(tmp_path / "env"))
    render(build_description(replace(plan, loaded=_site_target(tmp_path / "spec", "site")), CREATED), tmp_path / "site")

    def text(out: str, name: str) -> str:
        return (tmp_path / out / name).read_text()

    system_end, directives_end = "mkdir -p /opt/app\n", "#PBS -o bert-gpu.out\n"
    summary = shlex.quote(build_description(plan, CREATED).summary)  # the site template's `sh` filter
    assert text("shipped", "Dockerfile").count(system_end) == text("shipped", "job.sh").count(directives_end) == 1
    assert text("site", "Dockerfile") == text("shipped", "Dockerfile").replace(
        system_end, f"{system_end}RUN printf '%s\\n' {summary} > /etc/modak-job\n")
    assert text("site", "job.sh") == text("shipped", "job.sh").replace(
        directives_end, f"{directives_end}#PBS -l place=excl\n")
    for name in ("Singularity.def", "entrypoint.sh"):
        assert text("site", name) == text("shipped", name)


@pytest.mark.parametrize("templates, message, line", [
    ({"dockerfile/Dockerfile.j2": '{% extends "dockerfile/Dockerfile.j2" %}\n'}, "extend each other in a loop", None),
    ({"dockerfile/Dockerfile.j2": "FROM {{ ir.base.ref | word }\n"}, "unexpected '}'", 1),
    ({"jobscript/base.sh.j2": "\n{{ ir.summary | dockerfile_str }}\n"}, "No filter named 'dockerfile_str'", 2),
    ({"jobscript/base.sh.j2": "{{ ir.no_such_value | sh }}\n"}, "no attribute 'no_such_value'", None),
])
def test_site_template_errors_are_input_errors(tmp_path: Path, templates: dict[str, str], message: str,
                                               line: int | None) -> None:
    """Errors in a site template (a self-extension, syntax, another family's filter, an unknown value) are
    input errors, located in the template where Jinja2 knows the line."""
    plan, source = pbs_case(tmp_path / "spec")
    _write_templates(tmp_path / "spec" / "site", templates)
    with pytest.raises(InputError) as error:
        render(build_description(replace(plan, loaded=_site_target(tmp_path / "spec", "site")), CREATED),
               tmp_path / "out")
    assert message in error.value.message and error.value.exit_code == EXIT_BAD_INPUT
    assert (error.value.file, error.value.line) == ((str(tmp_path / "spec" / "site" / next(iter(templates))), line)
                                                    if line else (None, None))
    assert not (tmp_path / "out").exists()


def test_missing_site_templates_are_input_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan, source = pbs_case(tmp_path)
    with pytest.raises(InputError) as error:
        _site_target(tmp_path, "site-templates")
    assert error.value.field == "container.templates" and error.value.file == str(tmp_path / "target.yaml")
    assert error.value.line and str(tmp_path / "site-templates") in error.value.message
    (tmp_path / "site-templates").mkdir()
    monkeypatch.setenv("MODAK_TEMPLATES", str(tmp_path / "nowhere"))
    with pytest.raises(InputError) as error:
        load_job(tmp_path / "job.yaml")
    assert error.value.field == "MODAK_TEMPLATES" and str(tmp_path / "nowhere") in error.value.message


def test_a_base_image_without_default_is_an_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan, _ = bash_case(tmp_path)
    _without_default_bases(tmp_path, monkeypatch)
    with pytest.raises(InputError) as error:
        build_description(plan, CREATED)
    assert error.value.field == "container.base_images" and error.value.exit_code == EXIT_BAD_INPUT


def test_data_location_must_fit_the_bind_syntax(tmp_path: Path) -> None:
    plan, _ = slurm_case(tmp_path)
    loaded = plan.loaded
    job = msgspec.structs.replace(loaded.job, data=DataSpec(location="/scratch/a:b"))
    with pytest.raises(InputError) as error:
        resolve_files(job, loaded.target, loaded.job_doc, loaded.target_doc)
    assert error.value.field == "data.location"
    job = msgspec.structs.replace(loaded.job, data=DataSpec(location="/scratch/a", output="/scratch/b:c"))
    with pytest.raises(InputError) as error:
        resolve_files(job, loaded.target, loaded.job_doc, loaded.target_doc)
    assert error.value.field == "data.output"


def test_a_relative_results_folder_is_the_job_files_and_needs_its_own_mount(tmp_path: Path) -> None:
    plan, _ = slurm_case(tmp_path)
    loaded = plan.loaded
    job = msgspec.structs.replace(loaded.job, data=DataSpec(location="/scratch/a", output="results"))
    data = resolve_files(job, loaded.target, loaded.job_doc, loaded.target_doc).data
    assert data is not None and data.output == str(tmp_path / "results") and data.output_mount == "/output"
    with pytest.raises(ValueError, match="output_mount /data/ is the data set's mount"):
        DataSpec(location="/scratch/a", output="/scratch/b", output_mount="/data/")


def test_failed_render_leaves_no_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan, _ = slurm_case(tmp_path / "spec")

    def failing_copy(item: Any, root: Path) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(render_module, "_copy", failing_copy)
    with pytest.raises(OSError):
        render(build_description(plan, CREATED), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec"]


def test_failed_render_keeps_existing_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan, _ = pbs_case(tmp_path / "spec")
    ir = build_description(plan, CREATED)
    out = tmp_path / "out"
    out.mkdir()
    (out / "Dockerfile").write_text("FROM old\n")
    (out / "wheels").mkdir()
    (out / "wheels" / "stale.whl").write_bytes(b"")
    (out / "bert-gpu.sif").write_text("built image\n")
    copy = render_module._copy

    def failing_copy(item: Any, root: Path) -> None:
        if item.path.startswith("model/"):
            raise OSError("disk full")
        copy(item, root)

    monkeypatch.setattr(render_module, "_copy", failing_copy)
    with pytest.raises(OSError):
        render(ir, out)
    assert (out / "Dockerfile").read_text() == "FROM old\n"
    assert sorted(p.name for p in out.iterdir()) == ["Dockerfile", "bert-gpu.sif", "wheels"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "spec"]

    monkeypatch.setattr(render_module, "_copy", copy)
    written = render(ir, out)
    assert written == [out / name for name in OUTPUTS]
    assert (out / "Dockerfile").read_text().startswith(f"# Generated by modak {modak.__version__}: ")
    assert f'io.modak.version="{modak.__version__}"' in (out / "Dockerfile").read_text()
    assert sorted(p.name for p in out.iterdir()) == sorted([*OUTPUTS, ".dockerignore", "bert-gpu.sif", "modak-wheel",
                                                            "model"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "spec"]


def test_rendered_files_have_the_created_time(tmp_path: Path) -> None:
    """Every file of the context carries the `created` label's time, so a re-render of unchanged inputs leaves
    the COPY layers' cache keys unchanged."""
    plan, _ = slurm_case(tmp_path)
    out = tmp_path / "out"
    render(build_description(plan, CREATED), out)
    stamp = datetime.fromisoformat(CREATED.replace("Z", "+00:00")).timestamp()
    times = {p.stat().st_mtime for p in out.rglob("*")}
    assert times == {stamp}
