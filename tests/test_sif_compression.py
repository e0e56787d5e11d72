"""A target's ``container.sif_compression``: what the definition file says to build it with, what the Apptainer
engine runs (a stand-in ``apptainer`` that records its arguments), the clear error of an Apptainer without
``--mksquashfs-args``, and a bad value. The real builds and runs of each setting are in tests/test_apptainer.py
(gzip, and gzip-fast by ``--sif``) and tests/test_two_nodes.py (zstd, read on two nodes)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from spython.main.parse.parsers import SingularityParser

from modak.api import load as load_job
from modak.build.engines import ApptainerEngine, BuildLog
from modak.errors import EXIT_BAD_INPUT, EXIT_ENGINE_UNAVAILABLE, EngineUnavailable, InputError
from modak.render.ir import MKSQUASHFS_ARGS, build_description
from modak.render.render import render
from modak.spec.target import Container
from tests.support.onnx_graphs import write_onnx
from tests.test_render import CREATED, Preferred, make_plan_for

ROOT = Path(__file__).resolve().parents[1]
WITH_OPTION = "  --mksquashfs-args string   extra arguments to pass to mksquashfs\n"


def fake_apptainer(folder: Path, usage: str) -> Path:
    """An ``apptainer`` that appends its arguments (one shell-quoted line) to ``folder/calls``, prints ``usage``
    for ``build --help``, and writes an empty file where a build's output goes (its next-to-last argument)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "apptainer"
    script.write_text(f"""#!/usr/bin/env python3
import shlex, sys
with open({str(folder / "calls")!r}, "a") as calls:
    calls.write(shlex.join(sys.argv[1:]) + "\\n")
if sys.argv[1:] == ["build", "--help"]:
    sys.stdout.write({usage!r})
elif sys.argv[1] == "build":
    open(sys.argv[-2], "w").close()
""")
    script.chmod(0o755)
    return script


def calls(folder: Path) -> list[list[str]]:
    path = folder / "calls"
    return [shlex.split(line) for line in path.read_text().splitlines()] if path.exists() else []


def plan_with(folder: Path, container: dict[str, str]):
    write_onnx(folder / "model.onnx")
    job = {"name": "mlp-serve", "target": "target.yaml", "task": "inference", "model": {"onnx": "model.onnx"},
           "constraints": {"runtimes": ["onnxruntime"]}}
    target = {"name": "site", "cpu": {"microarchitecture": "zen4", "cores_per_socket": 8}, "memory": {"size_gb": 32},
              "container": {"engine": "apptainer", **container}}
    return make_plan_for(folder, job, target, Preferred("onnxruntime", "cpu", "fp32"))[0]


@pytest.mark.parametrize("compression", sorted(MKSQUASHFS_ARGS))
def test_the_definition_file_says_how_its_sif_is_built(tmp_path: Path, compression: str) -> None:
    plan = plan_with(tmp_path / "spec", {"sif_compression": compression})
    render(build_description(plan, CREATED), tmp_path / "out")
    definition = tmp_path / "out" / "Singularity.def"
    args = MKSQUASHFS_ARGS[compression]
    how = f"apptainer build {f'--mksquashfs-args {shlex.quote(args)} ' if args else ''}mlp-serve.sif Singularity.def"
    assert f"# Build in this folder (paths in files are relative to it): {how}\n" in definition.read_text()
    parser = SingularityParser(str(definition))
    assert parser.recipe[parser.active_layer].files  # still a definition file spython reads


def test_the_engine_passes_the_compression_to_apptainer(tmp_path: Path) -> None:
    binary = fake_apptainer(tmp_path / "bin", WITH_OPTION)
    archive = tmp_path / "image.tar"
    archive.write_bytes(b"")
    for compression in sorted(MKSQUASHFS_ARGS):
        engine = ApptainerEngine(binary=str(binary)).for_target(Container(sif_compression=compression))
        engine.check()
        log = BuildLog(tmp_path / f"{compression}.log")
        engine.build_from_archive(archive, tmp_path / f"{compression}.sif", log)
        log.close()
        build = calls(tmp_path / "bin")[-1]
        args = MKSQUASHFS_ARGS[compression]
        squash = ["--mksquashfs-args", args] if args else []
        assert build[:1 + len(squash) + 2] == ["build", *squash, "--notest", "--force"], build
        assert (tmp_path / f"{compression}.sif").is_file()
        assert f"$ {shlex.join([str(binary), *build])}" in (tmp_path / f"{compression}.log").read_text()
    # only the settings that pass an option asked whether this Apptainer has it, once per engine
    assert [c for c in calls(tmp_path / "bin") if c == ["build", "--help"]] == [["build", "--help"]] * 2


def test_an_apptainer_without_the_option_is_a_clear_error(tmp_path: Path) -> None:
    binary = fake_apptainer(tmp_path / "bin", "Usage:\n  apptainer build [build options...] <image path> <source>\n")
    ApptainerEngine(binary=str(binary)).for_target(Container()).check()  # gzip asks nothing of it
    with pytest.raises(EngineUnavailable, match=r"container\.sif_compression asks mksquashfs for '-comp zstd "
                                                r"-Xcompression-level 3'.*Apptainer 1\.4 or later"):
        ApptainerEngine(binary=str(binary)).for_target(Container(sif_compression="zstd")).check()


def test_modak_build_stops_before_writing_anything(tmp_path: Path) -> None:
    """``modak build`` on a zstd target with an Apptainer that cannot pass it: exit 4 with the message, and no
    output folder."""
    fake_apptainer(tmp_path / "bin", "Usage:\n")
    plan_with(tmp_path / "spec", {"sif_compression": "zstd"})
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "modak", "build", tmp_path / "spec" / "job.yaml", "-o", out],
                            capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=600,
                            env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert result.returncode == EXIT_ENGINE_UNAVAILABLE, result.stderr
    assert "container.sif_compression" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_an_unknown_compression_is_bad_input(tmp_path: Path) -> None:
    plan_with(tmp_path / "spec", {})
    target = yaml.safe_load((tmp_path / "spec" / "target.yaml").read_text())
    target["container"]["sif_compression"] = "lz4"
    (tmp_path / "spec" / "target.yaml").write_text(yaml.safe_dump(target))
    with pytest.raises(InputError) as error:
        load_job(tmp_path / "spec" / "job.yaml")
    assert error.value.exit_code == EXIT_BAD_INPUT and "sif_compression" in str(error.value)
    assert "gzip-fast" in str(error.value)  # the message lists the values there are
