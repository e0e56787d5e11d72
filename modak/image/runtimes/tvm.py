"""Apache TVM (Relax): the ONNX graph imported at the request's static shapes, optionally tuned with
MetaSchedule, compiled for the host CPU and run in the Relax virtual machine.

A step is one call of the compiled ``main`` on a batch of the request's size (inputs copied into TVM tensors,
outputs copied back to NumPy). Importing, tuning and compiling all happen in :func:`prepare`.

Parameters:

- ``threads``: ``TVM_NUM_THREADS`` (set before TVM is first imported: the runner starts a fresh process per
  candidate) and the target's ``num-cores``, which MetaSchedule uses while tuning.
- ``tuning_trials``: 0 builds untuned (correct, but the default schedules are slow); N > 0 tunes with
  N MetaSchedule trials in all, spread evenly over the extracted tasks (``max_trials_per_task =
  ceil(N / tasks)``), the way ``relax.pipeline.static_shape_tuning_pipeline`` does (see :func:`tune`).

Tuning database: tuning writes MetaSchedule's JSON database (``database_workload.json``,
``database_tuning_record.json``) to ``<request.workdir>/tvm-tuning/<key>/`` (or the folder
``request.extra["tvm_tuning_dir"]``), where the key names the graph, the input shapes, the target and the TVM
version, plus ``modak-tuned.json`` recording how many trials it holds. A later prepare that asks for no more
trials than that applies the database without tuning (seconds instead of minutes); one that asks for more
tunes only the difference, starting from the stored records. Copying that folder into an image (under the
image's workdir) therefore bakes the tuning in: :func:`artifacts` names the folders worth copying.

Target: ``{"kind": "llvm", "mcpu": ..., "num-cores": ...}``. ``mcpu`` is ``request.extra["mcpu"]`` when
given, else the host CPU as LLVM itself detects it (what ``-mcpu=native`` would pick), else a name mapped
from archspec's host microarchitecture (:data:`ARCHSPEC_TO_LLVM`), else ``generic``.

Profiles (#40): :func:`profile` times the compiled primitives of a step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modak.image.kernels import Kernel, KernelTime, Profile
from modak.image.runtimes.base import Adapter, FunctionSession, RunRequest
from modak.image.runtimes.profiling import WARMUP_STEPS, median_step, op_class
from modak.paths import write_atomic

if TYPE_CHECKING:
    import numpy as np

MARKER = "modak-tuned.json"
TUNING_FOLDER = "tvm-tuning"  # under the request's workdir
BUILD_TIMEOUT_S = 60.0  # per candidate build in MetaSchedule (its default, 30 s, is tight on 2 shared cores)
# archspec microarchitecture -> LLVM CPU name, for when LLVM cannot name the host itself. Names missing
# here are tried as they are (``-`` for ``_``), then through their ancestors.
ARCHSPEC_TO_LLVM = {
    "x86_64": "x86-64", "x86_64_v2": "x86-64-v2", "x86_64_v3": "x86-64-v3", "x86_64_v4": "x86-64-v4",
    "zen": "znver1", "zen2": "znver2", "zen3": "znver3", "zen4": "znver4", "zen5": "znver5",
    "skylake_avx512": "skylake-avx512", "icelake": "icelake-server", "cascadelake": "cascadelake",
    "cooperlake": "cooperlake", "sapphirerapids": "sapphirerapids", "graniterapids": "graniterapids",
    "haswell": "haswell", "broadwell": "broadwell", "skylake": "skylake",
    "neoverse_n1": "neoverse-n1", "neoverse_v1": "neoverse-v1", "neoverse_v2": "neoverse-v2",
    "neoverse_n2": "neoverse-n2", "a64fx": "a64fx", "m1": "apple-m1", "m2": "apple-m2",
    "aarch64": "generic", "armv8.2a": "generic",
}


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> FunctionSession:
    return FunctionSession(_step(*_virtual_machine(request, inputs)))


def profile(request: RunRequest, inputs: dict[str, np.ndarray], steps: int) -> Profile:
    """The primitives of one profiled step, timed by a Relax VM instrument (TVM 0.27 has no graph debug executor
    and its VM no profiler): the VM calls it before and after each call instruction. A kernel is a call of a
    compiled primitive (``fused_conv2d_add_relu``, ``matmul``; its kind drops the numeric suffix that tells the
    primitives of different shapes apart); calls of the VM's builtins (``vm.builtin.*``: allocation, shape
    checks, reshapes) are ``unmapped_seconds``. ``shapes``: its arguments' shapes, its outputs' last
    (primitives are destination-passing); ``nodes`` stay empty: the Relax module keeps no ONNX node names."""
    import tvm

    vm, names = _virtual_machine(request, inputs)
    step = _step(vm, names)
    started: list[float] = []
    calls: list[tuple[str, float, list[Any]]] = []

    def instrument(_func: Any, symbol: str, before_run: bool, _ret: Any, *args: Any) -> int:
        now = time.perf_counter()
        if before_run:
            started.append(now)
        else:
            calls.append((str(symbol), now - started.pop(), [a for a in args if isinstance(a, tvm.runtime.Tensor)]))
        return int(tvm.relax.VMInstrumentReturnKind.NO_OP)

    vm.set_instrument(instrument)
    for _ in range(WARMUP_STEPS):
        step(inputs)
    walls: list[float] = []
    per_step: list[list[tuple[str, float, list[Any]]]] = []
    for _ in range(steps):
        calls.clear()
        start = time.perf_counter()
        step(inputs)
        walls.append(time.perf_counter() - start)
        per_step.append(list(calls))
    median = median_step(walls)
    found: dict[Kernel, list[float]] = {}
    unmapped = 0.0
    for symbol, seconds, tensors in per_step[median]:
        if symbol.startswith("vm."):
            unmapped += seconds
            continue
        kind = re.sub(r"\d+$", "", symbol)
        kernel = Kernel(kind=kind, op=op_class(kind), shapes=tuple(tuple(int(d) for d in t.shape) for t in tensors),
                        attributes=json.dumps({"dtypes": [str(t.dtype) for t in tensors]}, sort_keys=True))
        found.setdefault(kernel, []).append(seconds)
    return Profile(source="tvm-vm-instrument", steps=steps, step_seconds=walls[median],
                   kernels=tuple(KernelTime(kernel=k, seconds=sum(t), calls=len(t)) for k, t in found.items()),
                   unmapped_seconds=unmapped,
                   notes=(f"{steps} profiled steps; the primitives of the median step, timed by a Relax VM "
                          "instrument", "TVM's primitives are not mapped to ONNX nodes (the Relax module keeps no "
                          "node names)"))


def _virtual_machine(request: RunRequest, inputs: dict[str, np.ndarray]) -> tuple[Any, list[str]]:
    """The candidate compiled (and tuned) in a Relax VM, and the names of the graph inputs ``main`` takes."""
    if request.device != "cpu":
        raise ValueError("the tvm runtime here targets CPUs (llvm) only")
    if request.threads:
        os.environ["TVM_NUM_THREADS"] = str(int(request.threads))  # read when TVM's thread pool starts
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    target = tvm.target.Target({"kind": "llvm", "mcpu": host_mcpu(request.extra.get("mcpu")),
                                "num-cores": int(request.threads or _cpu_count())})
    model = onnx.load(request.onnx_path)  # with its external weights: they become constants
    mod = from_onnx(
        model, shape_dict={name: list(array.shape) for name, array in inputs.items()},
        dtype_dict={name: str(array.dtype) for name, array in inputs.items()}, keep_params_in_input=False)
    trials = int(request.params.get("tuning_trials", 0))
    if trials > 0:
        workers = int(request.threads or _cpu_count())
        mod = tune(mod, target, trials, tuning_dir(request, target, inputs), workers)
    executable = tvm.compile(mod, target=target)
    return relax.VirtualMachine(executable, tvm.cpu()), [value.name for value in model.graph.input
                                                         if value.name in inputs]


def _step(vm: Any, names: list[str]) -> Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]:
    """One step: ``main`` of ``vm`` on the feeds ``names`` (copied into TVM tensors; outputs copied back)."""
    import numpy as np
    import tvm

    main = vm["main"]
    device = tvm.cpu()

    def step(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        arguments = [tvm.runtime.tensor(np.ascontiguousarray(feeds[name]), device) for name in names]
        return [o.numpy() for o in _as_list(main(*arguments))]
    return step


def tune(mod: Any, target: Any, trials: int, work_dir: Path, workers: int) -> Any:
    """``mod`` with MetaSchedule schedules from ``work_dir``'s database, tuning first unless the database
    holds ``trials`` trials already.

    This is ``relax.pipeline.static_shape_tuning_pipeline`` taken apart: its pre-tuning passes, then
    MetaSchedule's ``tune_relax`` (what the pipeline's tuning pass calls) with a builder of our own (see
    :func:`build_candidate`), then the pipeline with 0 trials, which only applies the database.
    """
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    _light_tensor_intrinsics()
    marker = work_dir / MARKER
    done = json.loads(marker.read_text()).get("trials", 0) if marker.is_file() else 0
    remaining = max(0, trials - done)
    if remaining:
        work_dir.mkdir(parents=True, exist_ok=True)
        with target:
            lowered = tvm.transform.Sequential([relax.transform.DecomposeOpsForInference(),
                                                relax.transform.CanonicalizeBindings(),
                                                relax.pipeline.zero_pipeline()])(mod)
        tasks = ms.relax_integration.extract_tasks(lowered, target)
        per_task = max(1, math.ceil(remaining / max(1, len(tasks))))
        builder = ms.builder.LocalBuilder(max_workers=workers, timeout_sec=BUILD_TIMEOUT_S,
                                          f_build=build_candidate)
        # MetaSchedule logs to stdout, where the runner prints its JSON result: send it to stderr
        with contextlib.redirect_stdout(sys.stderr):
            ms.relax_integration.tune_relax(lowered, {}, target, str(work_dir), max_trials_global=remaining,
                                            max_trials_per_task=per_task, builder=builder)
        write_atomic(marker, json.dumps({"trials": done + remaining, "target": str(target)}) + "\n")
    with target:
        return relax.pipeline.static_shape_tuning_pipeline(0, target, str(work_dir))(mod)


def build_candidate(mod: Any, target: Any, _params: Any) -> Any:
    """MetaSchedule's ``default_build`` without its import of every tensor intrinsic.

    The default imports ``tvm.s_tir.tensor_intrin``, which registers the CUDA, ROCm, Hexagon, ... intrinsics
    too: 20-35 s on a 2-core machine, in every builder worker, and MetaSchedule starts new workers for every
    batch of candidates. Most of a small tuning budget went into that import, and the first candidates of
    each batch hit the builder's timeout. Runs in the builder's worker processes.
    """
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    _light_tensor_intrinsics()
    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def _light_tensor_intrinsics() -> None:
    """Make ``import tvm.s_tir.tensor_intrin`` load only the host CPU's intrinsics (x86 or Arm).

    The package is registered in ``sys.modules`` as an empty package over its real folder, so its
    ``__init__`` (which imports the intrinsics of every backend) does not run; any submodule still imports
    on demand. Nothing changes when the package is imported already.
    """
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    import importlib
    import importlib.util
    import platform
    import types

    spec = importlib.util.find_spec("tvm.s_tir.tensor_intrin")
    if spec is None or spec.submodule_search_locations is None:
        return
    package = types.ModuleType(spec.name, "host CPU tensor intrinsics only (see modak.image.runtimes.tvm)")
    package.__path__ = list(spec.submodule_search_locations)
    package.__package__ = spec.name
    package.__spec__ = spec
    sys.modules[spec.name] = package
    machine = platform.machine().lower()
    isa = {"x86_64": "x86", "amd64": "x86", "aarch64": "arm_cpu", "arm64": "arm_cpu"}.get(machine)
    if isa:
        setattr(package, isa, importlib.import_module(f"{spec.name}.{isa}"))


def tuning_dir(request: RunRequest, target: Any, inputs: dict[str, np.ndarray]) -> Path:
    """Where the tuning database of this graph, shapes and target lives (see the module docstring)."""
    import tvm

    if request.extra.get("tvm_tuning_dir"):
        return Path(request.extra["tvm_tuning_dir"])
    digest = hashlib.sha256()
    digest.update(Path(request.onnx_path).read_bytes())  # the graph (zoo exports keep weights beside it)
    digest.update(json.dumps({"shapes": {k: [list(v.shape), str(v.dtype)] for k, v in sorted(inputs.items())},
                              "target": str(target), "tvm": tvm.__version__}, sort_keys=True).encode())
    stem = request.zoo or Path(request.onnx_path).stem
    return Path(request.workdir) / TUNING_FOLDER / f"{stem}-b{request.batch_size}-{digest.hexdigest()[:12]}"


def artifacts(workdir: Path, model_stem: str, batch_size: int, image_model_stem: str) -> dict[str, Path]:
    """The tuning databases in ``workdir`` for this model and batch (those with a :data:`MARKER`), as path
    under the image's work folder -> host folder, named as :func:`tuning_dir` names them in the image."""
    folder = Path(workdir) / TUNING_FOLDER
    prefix = f"{model_stem}-b{batch_size}-"
    found: dict[str, Path] = {}
    for path in sorted(folder.glob(f"{prefix}*")) if folder.is_dir() else []:
        key = path.name[len(prefix):]
        if path.is_dir() and (path / MARKER).is_file() and key.isalnum():
            found[f"{TUNING_FOLDER}/{image_model_stem}-b{batch_size}-{key}"] = path
    return found


def host_mcpu(requested: str | None = None) -> str:
    """The LLVM CPU name to compile for (see the module docstring)."""
    from tvm.target import codegen

    triple = codegen.llvm_get_system_triple()

    def valid(name: str | None) -> bool:
        try:
            return bool(name) and name != "generic" and bool(codegen.llvm_is_valid_cpu(name, triple))
        except Exception:
            return False

    if requested:
        return requested
    try:
        system = codegen.llvm_get_system_cpu()
    except Exception:
        system = None
    if valid(system):
        return system
    try:
        import archspec.cpu

        host = archspec.cpu.host()
        for micro in [host, *host.ancestors]:
            name = ARCHSPEC_TO_LLVM.get(micro.name, micro.name.replace("_", "-"))
            if valid(name):
                return name
    except Exception:
        pass
    return "generic"


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _as_list(outputs: Any) -> list[Any]:
    import tvm

    if isinstance(outputs, tvm.runtime.Tensor):
        return [outputs]
    return [item for output in outputs for item in _as_list(output)]


class Tvm(Adapter):
    name = "tvm"
    framework = "tvm"
    packages = ("apache-tvm",)
    prepare = staticmethod(prepare)
    profile = staticmethod(profile)
    artifacts = staticmethod(artifacts)
