"""A runtime added as one module plus its recipe, outside modak (#65 item 1): the test writes a module with one
:class:`modak.image.runtimes.base.Adapter` subclass and its recipe into a folder of its own, declares it in the
entry point group ``modak.runtimes`` (a distribution's ``entry_points.txt``, as ``pip install`` writes it), and
puts the folder on ``PYTHONPATH``. No file of modak is touched. The real CLI then plans it, renders its build
context, and ``modak bench`` measures it through the launcher in a child process of its own, where the entry point
finds it again. The registry's own runtimes declare what their recipes say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from modak.candidates.catalog import load_catalog
from modak.image.runtimes.base import Adapter, adapter, adapters

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mnist-cnn-cpu"
NAME = "plain-ort"

MODULE = '''
"""A plain ONNX Runtime session: no options, the runtime modak does not ship."""
from pathlib import Path

from modak.image.runtimes.base import Adapter, FunctionSession


def prepare(request, inputs):
    import onnxruntime

    session = onnxruntime.InferenceSession(request.onnx_path, providers=["CPUExecutionProvider"])
    return FunctionSession(lambda feeds: session.run(None, dict(feeds)))


class PlainOrt(Adapter):
    name = "plain-ort"
    framework = "plain-ort"
    packages = ("onnxruntime",)
    recipe = Path(__file__).with_name("plain-ort.yaml")
    prepare = staticmethod(prepare)
'''

RECIPE = {
    "name": NAME, "title": "ONNX Runtime, a plain session (a test's plugin)", "framework": NAME,
    "model_format": "onnx", "tasks": ["inference"], "precisions": {"cpu": ["fp32"]},
    "container": {"cpu": {"base": "debian", "pip": ["onnxruntime==1.31.1"]}},
    "parameters": [{"name": "threads", "feature": "threads", "devices": ["cpu"], "values": ["all"]}],
    "performance": {"cpu": {"compute_efficiency": {"conv": 0.4, "matmul": 0.5, "default": 0.3},
                            "memory_efficiency": 0.5, "fusion": 0.5, "node_overhead_us": 2.0,
                            "call_overhead_us": 30.0}}}


@pytest.fixture
def plugin(tmp_path: Path) -> dict[str, str]:
    """The plugin's folder on PYTHONPATH: its module, its recipe and its distribution's entry point."""
    folder = tmp_path / "site"
    (folder / "modak_plain_ort-1.0.dist-info").mkdir(parents=True)
    (folder / "plain_ort_runtime.py").write_text(MODULE)
    (folder / "plain-ort.yaml").write_text(yaml.safe_dump(RECIPE, sort_keys=False))
    (folder / "modak_plain_ort-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: modak-plain-ort\nVersion: 1.0\n")
    (folder / "modak_plain_ort-1.0.dist-info" / "entry_points.txt").write_text(
        f"[modak.runtimes]\n{NAME} = plain_ort_runtime:PlainOrt\n")
    path = os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path}


def modak(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modak", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=900, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_a_runtime_from_an_entry_point_is_planned_rendered_and_measured(plugin: dict[str, str],
                                                                         tmp_path: Path) -> None:
    folder = tmp_path / "spec"
    folder.mkdir()
    job = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    job.update(name="plain", target=str(EXAMPLE / "target.yaml"), constraints={"runtimes": [NAME]})
    (folder / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    planned = modak("plan", folder / "job.yaml", "--json", env=plugin)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["choice"] == f"{NAME}/cpu/fp32 threads=all" and plan["deployment"]["runtime"] == NAME
    rendered = modak("render", folder / "job.yaml", "-o", tmp_path / "out", env=plugin)
    assert rendered.returncode == 0, rendered.stderr
    assert "onnxruntime==1.31.1" in (tmp_path / "out" / "Dockerfile").read_text()
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["deployment"]["runtime"] == NAME
    store = tmp_path / "perf.sqlite"
    measured = modak("bench", folder / "job.yaml", "--candidates", "all", "--launches", "1", "--min-seconds", "0.1",
                     "--budget", "0.3", "--store", store, "--json", env=plugin)
    assert measured.returncode == 0, measured.stderr
    rows = json.loads(measured.stdout)
    (row,) = rows
    # measured and checked against the fp32 reference ("contended": other processes ran on its cores meanwhile)
    assert row["runtime"] == NAME and row["status"] in ("ok", "contended"), row
    assert row["max_abs_error"] < 1e-3 and row["step_median_s"] > 0
    # without the plugin on the path, the runtime is unknown: a clear input error, not a traceback
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    refused = modak("plan", folder / "job.yaml", env=alone)
    assert refused.returncode == 2 and NAME in refused.stderr and "Traceback" not in refused.stderr


def test_the_shipped_runtimes_declare_what_their_recipes_say() -> None:
    registered, recipes = adapters(), load_catalog()
    assert set(registered) >= set(recipes)
    for name, recipe in recipes.items():
        runtime = registered[name]
        assert runtime.framework == recipe.framework, name
        assert runtime.packages and all(any(pin.startswith(p + "==") or pin.startswith(p + "[")
                                            for pins in recipe.container.values() for pin in pins.pip)
                                        for p in runtime.packages[:1]), name
        assert (runtime.kernels == "onnx") == runtime.implements(Adapter.planned_kernels), name
    assert adapter("torch-compile").source_file().name == "pytorch.py"
    with pytest.raises(KeyError, match="no runtime 'no-such-runtime'.*onnxruntime"):
        adapter("no-such-runtime")


def test_a_runtime_is_registered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Adapter, "registry", dict(Adapter.registry))
    with pytest.raises(ValueError, match="registered twice"):
        type("Again", (Adapter,), {"name": "onnxruntime", "framework": "onnxruntime"})


def test_the_installed_distributions_are_scanned_again_when_a_folder_on_the_path_changes(tmp_path: Path) -> None:
    """:func:`modak.paths.installed` keeps its scan in the cache under the import path's folders and their times: a
    distribution installed into a folder on the path (a new ``*.dist-info``) is found by the next process, and its
    entry points with it."""
    folder = tmp_path / "site"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]),
           "MODAK_CACHE": str(tmp_path / "cache")}
    ask = ("from modak.paths import installed; i = installed(); "
           "print(i.version('Fake_Dist'), i.entry_points.get('modak.runtimes'))")

    def seen() -> str:
        return subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert seen() == "None None"
    assert seen() == "None None"  # from the cache
    dist = folder / "fake_dist-2.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-dist\nVersion: 2.0\n")
    (dist / "entry_points.txt").write_text("[modak.runtimes]\nfake = fake_module:Fake\n")
    assert seen() == "2.0 [('fake', 'fake_module:Fake')]"
    assert seen() == "2.0 [('fake', 'fake_module:Fake')]"  # from the cache
