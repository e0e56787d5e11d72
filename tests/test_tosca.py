"""modak as a TOSCA orchestration plugin: the definitions validate strictly (tosca-parser), and xOpera 0.7.0
deploys, reports and undeploys them for real (dry run from a zipped CSAR, a bad spec, and one real build).

xOpera lives in its own virtual environment (its pins clash with modak's): `.ci/provision.sh opera` installs it
into /opt/modak-opera (or $MODAK_OPERA_VENV)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from modak.paths import data_dir

ROOT = Path(__file__).resolve().parent.parent
TOSCA = ROOT / "integrations" / "tosca"
EXAMPLE = TOSCA / "examples" / "cnn-service"
OPERA_VENV = Path(os.environ.get("MODAK_OPERA_VENV", "/opt/modak-opera"))
OPERA = OPERA_VENV / "bin" / "opera"
TIMINGS: dict[str, float] = {}


def opera_env(tmp_path: Path) -> dict[str, str]:
    """opera's venv first (its ansible-playbook), then this Python's `modak`."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(OPERA.parent), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["HOME"] = os.environ.get("HOME", str(tmp_path))
    env.pop("PYTHONPATH", None)
    return env


def opera(tmp_path: Path, *argv: str | Path, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    if not OPERA.is_file():
        pytest.fail(f"xOpera is not installed at {OPERA}: run `.ci/provision.sh opera` (CI provisions it)")
    start = time.perf_counter()
    done = subprocess.run([str(OPERA), *map(str, argv)], cwd=tmp_path, env=opera_env(tmp_path), capture_output=True,
                          text=True, timeout=timeout)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split(" ")[0].removeprefix("test_")[:24]
    key = f"{test}: opera {argv[0]}"
    TIMINGS[key] = TIMINGS.get(key, 0) + time.perf_counter() - start
    if check:
        assert done.returncode == 0, f"opera {' '.join(map(str, argv))}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def outputs(tmp_path: Path, state: Path) -> dict:
    done = opera(tmp_path, "outputs", "-p", state, "-f", "json")
    return {k: v["value"] for k, v in json.loads(done.stdout).items()}


def zip_csar(folder: Path, archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as csar:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and ".opera" not in path.parts and "__pycache__" not in path.parts:
                csar.write(path, path.relative_to(folder).as_posix())
    return archive


def example_inputs() -> dict:
    service = yaml.safe_load((EXAMPLE / "service.yaml").read_text())
    return {k: v.get("default") for k, v in service["topology_template"]["inputs"].items()}


def modak_plan(tmp_path: Path, job: str, target: str) -> dict:
    """`modak plan --json` of the same specs, for comparison with what opera reports."""
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / "job.yaml").write_text(job)
    (tmp_path / "specs" / "target.yaml").write_text(target)
    done = subprocess.run([sys.executable, "-m", "modak", "plan", str(tmp_path / "specs" / "job.yaml"), "--target",
                           str(tmp_path / "specs" / "target.yaml"), "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def chosen(plan: dict) -> dict:
    return next(c for c in plan["candidates"] if c["name"] == plan["choice"])


# --- static checks: fast, no opera -------------------------------------------------------------------------------


def test_tosca_parser_validates_the_definitions_strictly(tmp_path):
    from toscaparser.common.exception import ValidationError
    from toscaparser.tosca_template import ToscaTemplate

    ToscaTemplate(str(TOSCA / "modak-types.yaml"))
    template = ToscaTemplate(str(EXAMPLE / "service.yaml"))
    assert sorted(n.name for n in template.nodetemplates) == ["cnn_image", "cnn_job"]
    image = next(n for n in template.nodetemplates if n.name == "cnn_image")
    assert image.type == "modak.nodes.OptimizedImage"
    # strict: a misspelt property is an error, so the parser really checks against modak's types
    bad = tmp_path / "cnn-service"
    shutil.copytree(EXAMPLE, bad)
    service = (bad / "service.yaml").read_text()
    (bad / "service.yaml").write_text(service.replace("        dry_run: {get_input: dry_run}\n        output_dir",
                                                      "        dryrun: {get_input: dry_run}\n        output_dir"))
    with pytest.raises(ValidationError, match="dryrun"):
        ToscaTemplate(str(bad / "service.yaml"))


def test_the_types_declare_every_attribute_the_playbooks_set():
    """opera rejects a set_stats key that is not an attribute: check all of them against the types."""
    types = yaml.safe_load((TOSCA / "modak-types.yaml").read_text())["node_types"]
    for node_type in types.values():
        attributes = set(node_type["attributes"])
        for name, operation in node_type["interfaces"]["Standard"]["operations"].items():
            playbook = yaml.safe_load((TOSCA / operation["implementation"]).read_text())
            tasks = [t for play in playbook for t in play["tasks"]]
            tasks += [t for block in list(tasks) for t in block.get("block", []) + block.get("rescue", [])]
            stats = [t["ansible.builtin.set_stats"]["data"] for t in tasks if "ansible.builtin.set_stats" in t]
            keys = {k for data in stats for k in data}
            assert keys, f"{operation['implementation']} sets no attribute"
            assert keys <= attributes, f"{operation['implementation']}: {sorted(keys - attributes)} not declared"
            inputs = set(operation.get("inputs", {}))
            assert inputs, name


def test_the_example_csar_carries_the_shipped_types_and_playbooks():
    """The example is a self-contained CSAR, so it carries a copy of integrations/tosca/: keep them equal."""
    meta = (EXAMPLE / "TOSCA-Metadata" / "TOSCA.meta").read_text()
    assert "Entry-Definitions: service.yaml" in meta
    shipped = [TOSCA / "modak-types.yaml", *sorted((TOSCA / "playbooks").glob("*.yaml"))]
    for path in shipped:
        copy = EXAMPLE / "modak" / path.relative_to(TOSCA)
        assert copy.read_text() == path.read_text(), f"{copy} differs from {path}: cp {path} {copy}"
    assert sorted(p.name for p in (EXAMPLE / "modak" / "playbooks").iterdir()) == sorted(p.name for p in shipped[1:])


def test_the_definitions_are_package_data():
    assert (data_dir("integrations") / "tosca" / "modak-types.yaml").is_file()
    assert (data_dir("integrations") / "github" / "modak-step.sh").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"integrations" = "modak/_data/integrations"' in pyproject


# --- xOpera, for real ----------------------------------------------------------------------------------------------


@pytest.mark.opera
def test_opera_validates_the_service_template_and_its_playbooks(tmp_path):
    done = opera(tmp_path, "validate", "-e", "-p", tmp_path / "state", EXAMPLE / "service.yaml")
    assert "Validating cnn_image_0" in done.stdout and "Done." in done.stdout
    assert not (EXAMPLE / ".opera").exists()


@pytest.mark.opera
def test_opera_deploys_the_zipped_csar_dry_run_and_undeploys(tmp_path):
    csar = zip_csar(EXAMPLE, tmp_path / "cnn-service.zip")
    state, out_dir = tmp_path / "state", tmp_path / "nodes"
    state.mkdir()
    (tmp_path / "inputs.yaml").write_text(yaml.safe_dump({"dry_run": True, "output_dir": str(out_dir)}))
    done = opera(tmp_path, "validate", "-p", state, "-i", tmp_path / "inputs.yaml", csar)
    assert "Done." in done.stdout

    done = opera(tmp_path, "deploy", "-f", "-p", state, "-i", tmp_path / "inputs.yaml", csar)
    assert "Deployment of cnn_image_0 complete" in done.stdout and "Deployment of cnn_job_0 complete" in done.stdout
    result = outputs(tmp_path, state)
    inputs = example_inputs()
    plan = modak_plan(tmp_path, inputs["job"], inputs["target"])
    best = chosen(plan)
    # the attributes carry the real plan's values
    assert result["choice"] == plan["choice"]
    assert result["chosen_runtime"] == best["runtime"]
    as_text = {k: v if isinstance(v, str) else json.dumps(v) for k, v in best["parameters"].items()}
    assert result["parameters"] == as_text  # a map of strings (true, 1, LATENCY)
    assert result["predicted_step_seconds"] == best["step_seconds"]
    assert result["image_ref"] == "" and result["image_digest"] == ""  # dry run: nothing built
    script = Path(result["job_script"])
    assert script == out_dir / "context" / "job.sh" and script.is_file()
    assert json.loads((script.parent / "plan.json").read_text()) == plan
    assert {p.name for p in script.parent.iterdir()} >= {"Dockerfile", "Singularity.def", "entrypoint.sh", "job.sh"}
    assert result["job_command"] == f"bash {script}" and result["job_exit_code"] == -1  # checked, not run

    done = opera(tmp_path, "undeploy", "-f", "-p", state)
    assert "Undeployment of cnn_image_0 complete" in done.stdout
    assert not out_dir.exists()  # the rendered folders are gone
    info = json.loads(opera(tmp_path, "info", "-p", state, "-f", "json").stdout)
    assert info["status"] == "undeployed" and info["csar_valid"] is True


@pytest.mark.opera
def test_a_bad_spec_fails_the_deploy_with_modaks_message(tmp_path):
    inputs = example_inputs()
    bad_job = inputs["job"].replace("  batch_size: 64", "  batch_sise: 64")
    out_dir = tmp_path / "nodes"
    (tmp_path / "inputs.yaml").write_text(yaml.safe_dump({"dry_run": True, "output_dir": str(out_dir),
                                                          "job": bad_job}))
    (tmp_path / "state").mkdir()
    done = opera(tmp_path, "deploy", "-f", "-p", tmp_path / "state", "-i", tmp_path / "inputs.yaml",
                 EXAMPLE / "service.yaml", check=False)
    assert done.returncode != 0
    job_file = out_dir / "spec" / "job.yaml"
    line = job_file.read_text().splitlines().index("  batch_sise: 64") + 1
    expected = f"modak: error: {job_file}:{line}: model.batch_sise: unknown field; did you mean 'batch_size'?"
    # modak says the same on its own
    direct = subprocess.run([sys.executable, "-m", "modak", "plan", str(job_file), "--target",
                             str(out_dir / "spec" / "target.yaml")], capture_output=True, text=True)
    assert direct.returncode == 2 and direct.stderr.strip() == expected
    # and opera's output shows it (the node's error_message attribute, in the operation's stats)
    assert f'"error_message": {json.dumps(expected)}' in done.stdout, done.stdout[-3000:]
    assert "Failed in cnn_image" in done.stdout
    assert "cnn_job_0" not in done.stdout  # nothing ran after the failed node
    # after a failed deploy, opera undeploys only with --resume: delete cleans up the node's folder
    done = opera(tmp_path, "undeploy", "-r", "-f", "-p", tmp_path / "state")
    assert "Undeployment of cnn_image_0 complete" in done.stdout
    assert not out_dir.exists()


@pytest.mark.opera
@pytest.mark.engine
def test_opera_builds_the_image_runs_the_job_and_removes_both(tmp_path):
    """dry_run false: `modak build --json` with Podman, then the job script runs the image's self-test."""
    out_dir = tmp_path / "nodes"
    (tmp_path / "inputs.yaml").write_text(yaml.safe_dump({"dry_run": False, "engine": "podman",
                                                          "output_dir": str(out_dir)}))
    state = tmp_path / "state"
    state.mkdir()
    inputs = example_inputs()
    plan = modak_plan(tmp_path, inputs["job"], inputs["target"])
    image = ""
    try:
        opera(tmp_path, "deploy", "-f", "-p", state, "-i", tmp_path / "inputs.yaml", EXAMPLE / "service.yaml")
        result = outputs(tmp_path, state)
        image = result["image_ref"]
        runtime = chosen(plan)["runtime"]
        assert result["choice"] == plan["choice"] and result["chosen_runtime"] == runtime
        assert result["predicted_step_seconds"] == chosen(plan)["step_seconds"]
        assert image.startswith(f"localhost/modak/cnn-service:{runtime}-")
        assert result["image_digest"].startswith("sha256:")
        inspect = subprocess.run(["podman", "image", "inspect", image, "--format", "{{.Id}}"], capture_output=True,
                                 text=True)
        assert inspect.returncode == 0 and result["image_digest"] == "sha256:" + inspect.stdout.strip()
        # the BatchJob ran job.sh, which ran the image: its self-test printed one JSON line
        assert result["job_exit_code"] == 0
        report = json.loads(next(line for line in result["job_output"].splitlines() if line.startswith("{")))
        assert report["status"] == "ok" and report["runtime"] == runtime

        opera(tmp_path, "undeploy", "-f", "-p", state)
        assert subprocess.run(["podman", "image", "exists", image]).returncode == 1  # removed
        assert not out_dir.exists()
    finally:
        if image:
            subprocess.run(["podman", "rmi", "--force", image], capture_output=True)
        print("\ntimings (s):\n" + "\n".join(f"  {k} {v:.1f}" for k, v in TIMINGS.items()))
