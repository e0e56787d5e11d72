"""The extension points' registries: every list of scheduler and engine names (the spec's, its JSON Schema's, the
command line's) is the registries'; a scheduler and an engine that only this file defines, registered for one
test, render, submit and build through the same code as modak's own, and leave nothing registered behind."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
import yaml

from modak.api import load as load_job
from modak.api import schemas
from modak.build.engines import ENGINES, BuildLog, Engine, ImageInfo, RunResult, make_engine
from modak.build.pipeline import LOCK_LABEL, BuildOptions, build_job
from modak.build.submit import submit, wait
from modak.cli import _parser
from modak.errors import InputError
from modak.paths import data_dir
from modak.plan import Plan, make_plan
from modak.render.ir import build_description
from modak.render.render import render
from modak.schedulers import SCHEDULERS, Scheduler, Submission, scheduler
from modak.spec.names import ENGINE_NAMES
from modak.spec.target import Scheduler as SchedulerSpec
from modak.workload.source import load_analysis
from tests.support.onnx_graphs import write_onnx

# The fake scheduler's submit command: records its arguments beside the script and prints a job id.
FAKE_SUBMIT = ("import pathlib, sys; script = pathlib.Path(sys.argv[-1]); "
               "(script.parent / 'submitted.txt').write_text(' '.join(sys.argv[1:])); print('queued 4711')")
FAKE_TEMPLATE = """{% extends "jobscript/base.sh.j2" %}
{% block directives %}
#FAKE --name={{ job.name | word }} --time={{ job.time_limit | word }} --out={{ job.log_file | word }}
{% endblock %}
"""


class FakeScheduler(Scheduler):
    """A scheduler only this test knows: its time limit in minutes, its submit command a tiny Python script."""

    template = "jobscript/fake.sh.j2"
    command = sys.executable
    submit_options = ("-c", FAKE_SUBMIT, "--queue=fast")
    job_id = re.compile(r"^queued (\d+)$")

    def log_file(self, job_name: str) -> str:
        return f"{job_name}.fake-out"

    def time_limit(self, limit: str) -> str:
        hours, minutes, _ = (int(part) for part in limit.split(":"))
        return str(hours * 60 + minutes)

    def state(self, submission: Submission) -> tuple[str | None, int | None]:
        return ("COMPLETED", 0) if (submission.cwd / "submitted.txt").is_file() else (None, None)


class FakeEngine(Engine):
    """An engine only this test knows: images live in memory; a run prints the self-test report of the
    deployment its build context held."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.images: dict[str, dict[str, Any]] = {}
        self.tags: dict[str, str] = {}

    def check(self) -> None:
        pass

    def endpoint(self) -> str:
        return "memory"

    def build(self, context: Path, log: BuildLog, no_cache: bool = False) -> str:
        log.write("STEP 1/1: FROM fake\n")
        image = f"fake-{len(self.images)}"
        self.images[image] = {"deployment": json.loads((context / "plan.json").read_text())["deployment"], "labels": {},
                              "dockerfile": (context / "Dockerfile").read_text()}
        return image

    def tag(self, image: str, ref: str) -> None:
        self.tags[ref] = image

    def inspect(self, ref: str) -> ImageInfo | None:
        image = self.tags.get(ref, ref)
        return ImageInfo(image, (ref,), self.images[image]["labels"]) if image in self.images else None

    def run(self, image: str, command: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 600, gpus: int = 0, network: bool = False) -> RunResult:
        deployment = self.images[image]["deployment"]
        report = {"status": "ok", "runtime": deployment["runtime"], "device": deployment["device"]}
        return RunResult(0, f"self-test of {' '.join(command or ())}\n{json.dumps(report)}\n", "")

    def read_file(self, image: str, path: str) -> bytes | None:
        return b"onnxruntime==1.0\nnumpy==2.0\n" if path.endswith(".lock") else None

    def add_layer(self, image: str, labels: Mapping[str, str], files: Mapping[str, Path], log: BuildLog) -> str:
        layered = f"{image}+labels"
        self.images[layered] = {**self.images[image], "labels": dict(labels)}
        return layered


def _plan(folder: Path) -> Plan:
    """A tiny inference job on a CPU target without a scheduler, whose site templates hold the fake's."""
    write_onnx(folder / "model.onnx")
    (folder / "site" / "jobscript").mkdir(parents=True)
    (folder / "site" / "jobscript" / "fake.sh.j2").write_text(FAKE_TEMPLATE)
    job = {"name": "tiny", "target": "target.yaml", "task": "inference", "model": {"onnx": "model.onnx"},
           "constraints": {"runtimes": ["onnxruntime"]}}
    target = {"name": "node", "cpu": {"microarchitecture": "icelake", "cores_per_socket": 8},
              "memory": {"size_gb": 32}, "scheduler": {"time_limit": "02:30:00"},
              "container": {"engine": "podman", "templates": "site"}}
    (folder / "job.yaml").write_text(yaml.safe_dump({"apiVersion": "modak/v1", "kind": "Job", **job}))
    (folder / "target.yaml").write_text(yaml.safe_dump({"apiVersion": "modak/v1", "kind": "Target", **target}))
    loaded = load_job(folder / "job.yaml")
    return make_plan(loaded, *load_analysis(loaded))


def _on(plan: Plan, kind: str) -> Plan:
    """``plan`` with its target's scheduler.kind set to ``kind`` (a name the spec, built before it, does not know)."""
    target = plan.loaded.target
    settings = msgspec.structs.replace(target.scheduler, kind=kind)
    return replace(plan, loaded=replace(plan.loaded, target=msgspec.structs.replace(target, scheduler=settings)))


def _choices(command: str, option: str) -> tuple[str, ...]:
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in commands.choices[command]._actions if option in a.option_strings)
    return tuple(action.choices)


def test_scheduler_names_come_from_the_registry() -> None:
    assert SCHEDULERS.names() == ("slurm", "pbs", "none")
    kind = next(f for f in msgspec.structs.fields(SchedulerSpec) if f.name == "kind")
    literal, *_ = get_args(kind.type)  # Annotated[Literal[...], Meta(description=...)]
    assert get_args(literal) == SCHEDULERS.names()
    schema = schemas()["target"]
    assert sorted(schema["$defs"]["Scheduler"]["properties"]["kind"]["enum"]) == sorted(SCHEDULERS.names())
    assert _choices("tune", "--dispatch") == ("local", "slurm")  # the schedulers that run job arrays
    for name in SCHEDULERS.names():
        assert (data_dir("templates") / scheduler(name).template).is_file(), name


def test_engine_names_have_one_home_and_every_one_is_registered() -> None:
    assert sorted(ENGINES.names()) == sorted(ENGINE_NAMES)
    schema = schemas()["target"]
    assert sorted(schema["$defs"]["Container"]["properties"]["engine"]["enum"]) == sorted(ENGINE_NAMES)
    assert _choices("build", "--engine") == ENGINE_NAMES
    assert [make_engine(name).name for name in ENGINE_NAMES] == list(ENGINE_NAMES)


def test_a_scheduler_registered_by_a_test_renders_and_submits(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    with SCHEDULERS.registered("fake", FakeScheduler):
        ir = build_description(_on(plan, "fake"))
        render(ir, tmp_path / "out")
        script = tmp_path / "out" / "job.sh"
        text = script.read_text()
        submission = submit(script, ir.job.scheduler, ir.job.log_file)
        ended = wait(submission, timeout=10, poll=0.05)
    assert text.startswith("#!/usr/bin/env bash\n#FAKE --name=tiny --time=150 --out=tiny.fake-out\n")
    assert "set -euo pipefail" in text and "podman run --rm" in text  # the rest is base.sh.j2's
    assert (submission.scheduler, submission.job_id) == ("fake", "4711")
    assert submission.output == script.parent / "tiny.fake-out"
    assert (script.parent / "submitted.txt").read_text() == f"--queue=fast {script}"
    assert (ended.state, ended.exit_code) == ("COMPLETED", 0)
    assert "fake" not in SCHEDULERS.names()
    with pytest.raises(InputError, match=r"unknown scheduler 'fake' \(one of slurm, pbs, none\)"):
        scheduler("fake")


def test_a_registered_name_cannot_be_registered_again() -> None:
    with pytest.raises(ValueError, match="scheduler 'slurm' is registered already"):
        SCHEDULERS.register("slurm")(FakeScheduler)
    assert SCHEDULERS.get("slurm") is not FakeScheduler


def test_an_engine_registered_by_a_test_builds_through_the_pipeline(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    with ENGINES.registered("fake", FakeEngine):
        result = build_job(plan, tmp_path / "out", BuildOptions(engine="fake"))
    assert isinstance(result.engine, FakeEngine) and result.engine.name == "fake"
    assert result.image_ref == result.ir.image.ref and result.image is not None
    assert result.image.id == "fake-0+labels" and result.image.labels[LOCK_LABEL].startswith("sha256:")
    assert result.smoke == {"status": "ok", "runtime": "onnxruntime", "device": "cpu"}
    assert "FROM" in result.engine.images["fake-0"]["dockerfile"]
    assert "STEP 1/1: FROM fake" in (tmp_path / "out" / "build.log").read_text()
    assert "fake" not in ENGINES.names()
    with pytest.raises(InputError, match="unknown container engine 'fake'"):
        make_engine("fake")
