"""Per-kernel profiles (#40) of ONNX Runtime and OpenVINO: real profiled runs of a small Conv+BatchNorm+ReLU graph,
the kernels mapped back to the ONNX nodes they cover, and ``modak measure --profile`` through the launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from modak.image.deployment import Deployment
from modak.image.kernels import Profile
from modak.image.onnx_nodes import fed_shapes
from modak.image.runtimes import onnxruntime as ort_runtime
from modak.image.runtimes import openvino as ov_runtime
from modak.image.runtimes.base import RunRequest, load_profiler, make_inputs
from tests.support.onnx_graphs import CONV_BN_RELU_NODES, write_conv_bn_relu

pytestmark = pytest.mark.slow  # real runtimes

STEPS = 5
UNNAMED = ("Conv_0", "BatchNormalization_1", "Relu_2", "MaxPool_3", "Flatten_4", "MatMul_5")  # as analysis names


def request(tmp_path: Path, runtime: str, named: bool = True, **params: object) -> RunRequest:
    path = tmp_path / ("named.onnx" if named else "unnamed.onnx")
    write_conv_bn_relu(path, named)
    return RunRequest(runtime=runtime, device="cpu", precision="fp32", params=dict(params), threads=1,
                      task="inference", onnx_path=str(path), zoo=None, batch_size=2, input_shapes={"x": [8, 16, 16]},
                      workdir=str(tmp_path))


def profiled(run: RunRequest) -> Profile:
    profiler = load_profiler(run.runtime)
    assert profiler is not None
    return profiler(run, make_inputs(run), STEPS)


def check_profile(profile: Profile, source: str, names: tuple[str, ...]) -> dict[tuple[str, ...], str]:
    """What every profile must satisfy; returns kind by covered nodes."""
    assert profile.source == source and profile.steps == STEPS
    assert all(k.seconds >= 0 and k.calls >= 1 for k in profile.kernels)
    assert profile.unmapped_seconds >= 0
    assert profile.kernel_seconds() + profile.unmapped_seconds <= profile.step_seconds
    covered = [n for k in profile.kernels for n in k.kernel.nodes]
    assert len(covered) == len(set(covered)) and set(covered) <= set(names)  # each ONNX node in one kernel at most
    assert Profile.from_json(profile.to_json()) == profile
    assert all(k.kernel.flops == 0.0 and k.kernel.bytes == 0.0 for k in profile.kernels)  # the host fills them
    return {k.kernel.nodes: k.kernel.kind for k in profile.kernels}


@pytest.mark.parametrize("named", [True, False])
def test_onnxruntime_fused_conv_covers_conv_batchnorm_relu(tmp_path, named):
    names = CONV_BN_RELU_NODES if named else UNNAMED
    profile = profiled(request(tmp_path, "onnxruntime", named))
    kinds = check_profile(profile, "onnxruntime-profiler", names)
    # All optimizations: where MLAS has NCHWc kernels, a NCHWc convolution with Relu as its activation and a NCHWc
    # MaxPool (then a ReorderOutput back to NCHW, which covers no ONNX node); else a FusedConv and a MaxPool.
    nchwc = kinds[names[:3]] == "nchwc.Conv"
    assert kinds[names[:3]] == ("nchwc.Conv" if nchwc else "FusedConv")
    assert kinds[names[3:4]] == ("nchwc.MaxPool" if nchwc else "MaxPool") and kinds[names[5:]] == "MatMul"
    conv = next(k.kernel for k in profile.kernels if k.kernel.nodes == names[:3])
    assert conv.shapes[0] == (2, 8, 16, 16) and json.loads(conv.attributes)["activation"] == "Relu"
    assert nchwc or profile.unmapped_seconds == 0  # (a ReorderOutput may take less than the trace's microsecond)


@pytest.mark.parametrize("level, kernels", [
    ("extended", {("conv", "bn", "relu"): "FusedConv"}),
    ("basic", {("conv", "bn"): "Conv", ("relu",): "Relu"}),  # BatchNorm folded into the Conv, Relu on its own
    ("disabled", {("conv",): "Conv", ("bn",): "BatchNormalization", ("relu",): "Relu"}),
])
def test_onnxruntime_kernels_follow_its_optimization_level(tmp_path, level, kernels):
    profile = profiled(request(tmp_path, "onnxruntime", graph_optimization=level))
    kinds = check_profile(profile, "onnxruntime-profiler", CONV_BN_RELU_NODES)
    assert kinds == {**kernels, ("pool",): "MaxPool", ("flat",): "Flatten", ("fc",): "MatMul"}
    assert profile.unmapped_seconds == 0


def test_onnxruntime_graph_kernels_follow_tensors(tmp_path):
    """The mapping alone, on the optimized graph ONNX Runtime writes: a conversion covers nothing, a fusion all it
    replaced."""
    import onnx
    import onnxruntime as ort

    run = request(tmp_path, "onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(run.onnx_path, options, providers=["CPUExecutionProvider"])
    original = onnx.load(run.onnx_path)
    kernels = ort_runtime.graph_kernels(original.graph, onnx.load(tmp_path / "optimized.onnx").graph,
                                        fed_shapes(original, {"x": (2, 8, 16, 16)}))
    assert [(k.kind, k.nodes) for k in kernels] == [
        ("FusedConv", ("conv", "bn", "relu")), ("MaxPool", ("pool",)), ("Flatten", ("flat",)), ("MatMul", ("fc",))]
    assert kernels[0].shapes == ((2, 8, 16, 16), (16, 8, 3, 3), (16,))  # the inputs at the fed batch, the weights


def write_residual(path: Path) -> None:
    """conv1 -> relu1 -> conv2 -> add (+ relu1's output) -> relu2 -> conv3, 16 channels (NCHWc blocks) at 8x8."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.uniform(-0.3, 0.3, (16, 16, 3, 3)).astype(np.float32), f"w{i}")
               for i in (1, 2, 3)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["a"], "add"),
             helper.make_node("Relu", ["a"], ["r2"], "relu2"),
             helper.make_node("Conv", ["r2", "w3"], ["y"], "conv3", pads=[1, 1, 1, 1])]
    shape: list[str | int | None] = ["N", 16, 8, 8]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save_model(model, path)


def test_onnxruntime_residual_add_stays_with_the_convolution_that_sums_it(tmp_path):
    """A NCHWc convolution sums a residual into its output, then applies its activation: it covers the Add and the
    Relu, the next convolution neither."""
    write_residual(tmp_path / "residual.onnx")
    run = RunRequest(runtime="onnxruntime", device="cpu", precision="fp32", params={}, threads=1, task="inference",
                     onnx_path=str(tmp_path / "residual.onnx"), zoo=None, batch_size=2,
                     input_shapes={"x": [16, 8, 8]}, workdir=str(tmp_path))
    profile = profiled(run)
    kinds = check_profile(profile, "onnxruntime-profiler", ("conv1", "relu1", "conv2", "add", "relu2", "conv3"))
    # The layout conversions to and from NCHWc are kernels of their own, covering no node.
    assert all(k.kernel.kind.startswith("nchwc.Reorder") and k.kernel.op == "data_movement"
               for k in profile.kernels if not k.kernel.nodes)
    kinds.pop((), None)
    # Without MLAS's NCHWc kernels, the Add and the Relu run on their own.
    assert kinds in ({("conv1", "relu1"): "nchwc.Conv", ("conv2", "add", "relu2"): "nchwc.Conv",
                      ("conv3",): "nchwc.Conv"},
                     {("conv1", "relu1"): "FusedConv", ("conv2",): "Conv", ("add",): "Add", ("relu2",): "Relu",
                      ("conv3",): "Conv"})


def test_onnxruntime_trace_of_unnamed_nodes(tmp_path):
    """The parser alone on a trace of a graph whose nodes have no names (``profile`` names them first): the
    profiler calls them ``<op type>_<index>``, matched by op type in graph order."""
    import onnx
    import onnxruntime as ort

    run = request(tmp_path, "onnxruntime", named=False)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "trace")
    session = ort.InferenceSession(run.onnx_path, options, providers=["CPUExecutionProvider"])
    for _ in range(STEPS):
        session.run(None, make_inputs(run))
    events = json.loads(Path(session.end_profiling()).read_text())
    optimized = onnx.load(tmp_path / "optimized.onnx").graph
    assert not any(node.name for node in optimized.node)
    original = onnx.load(run.onnx_path)
    kernels = ort_runtime.graph_kernels(original.graph, optimized, fed_shapes(original, {"x": (2, 8, 16, 16)}))
    profile = ort_runtime.parse_trace(events, kernels, STEPS, step_seconds=1.0)
    assert [(k.kernel.kind, k.kernel.nodes, k.calls) for k in profile.kernels] == [
        ("FusedConv", UNNAMED[:3], 1), ("MaxPool", UNNAMED[3:4], 1), ("Flatten", UNNAMED[4:5], 1),
        ("MatMul", UNNAMED[5:], 1)]
    assert all(k.seconds > 0 for k in profile.kernels[:1]) and profile.unmapped_seconds == 0


@pytest.mark.parametrize("named", [True, False])
def test_openvino_fused_convolution_covers_conv_batchnorm_relu(tmp_path, named):
    names = CONV_BN_RELU_NODES if named else UNNAMED
    profile = profiled(request(tmp_path, "openvino", named, performance_hint="LATENCY"))
    kinds = check_profile(profile, "openvino-counters", names)
    # The CPU plugin fuses BatchNorm and Relu into the convolution and renames it (originalLayersNames
    # "Multiply_N,bn,relu"): the renamed node is found upstream. Flatten is a Reshape it does not execute. The
    # reorders it inserts are kernels covering no node.
    assert all(k.kernel.kind.startswith("Reorder:") and k.kernel.op == "data_movement"
               for k in profile.kernels if not k.kernel.nodes)
    kinds.pop((), None)
    assert kinds[names[:3]].startswith("Convolution:")
    assert kinds[names[3:4]].startswith("Pooling:") and kinds[names[5:]].startswith("FullyConnected:")
    assert set(kinds) == {names[:3], names[3:4], names[5:]}
    conv = next(k for k in profile.kernels if k.kernel.nodes == names[:3])
    assert conv.seconds > 0 and conv.kernel.shapes[0] == (2, 8, 16, 16)


def test_openvino_streams_divide_kernel_times(tmp_path):
    run = request(tmp_path, "openvino", performance_hint="THROUGHPUT")
    session = ov_runtime.prepare(run, make_inputs(run))
    profile = profiled(run)
    check_profile(profile, "openvino-counters", CONV_BN_RELU_NODES)
    assert any("streams" in note for note in profile.notes) == (session.batches_per_step > 1)


@pytest.mark.parametrize("runtime, source, kind", [("onnxruntime", "onnxruntime-profiler", "FusedGemm"),
                                                   ("openvino", "openvino-counters", "FullyConnected:")])
def test_matmul_add_relu_is_one_kernel(tmp_path, runtime, source, kind):
    """ONNX Runtime fuses them into a FusedGemm named after none of them; OpenVINO into a FullyConnected whose
    originalLayersNames leaves the MatMul out: both kernels cover all three nodes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.uniform(-1, 1, (256, 256)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.uniform(-1, 1, (256,)).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], "matmul"), helper.make_node("Add", ["m", "b"], ["a"], "add"),
             helper.make_node("Relu", ["a"], ["y"], "relu")]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 256])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save_model(model, tmp_path / "dense.onnx")
    run = RunRequest(runtime=runtime, device="cpu", precision="fp32", params={}, threads=1, task="inference",
                     onnx_path=str(tmp_path / "dense.onnx"), zoo=None, batch_size=8, input_shapes={"x": [256]},
                     workdir=str(tmp_path))
    profile = profiled(run)
    kinds = check_profile(profile, source, ("matmul", "add", "relu"))
    assert list(kinds) == [("matmul", "add", "relu")] and kinds[("matmul", "add", "relu")].startswith(kind)
    assert profile.kernels[0].seconds > 0 and profile.kernels[0].kernel.shapes[0] == (8, 256)


@pytest.mark.parametrize("runtime, source, kind", [("onnxruntime", "onnxruntime-profiler", "QLinearConv"),
                                                   ("openvino", "openvino-counters", "Convolution:")])
def test_int8_convolution_covers_its_quantize_and_dequantize_nodes(tmp_path, runtime, source, kind):
    """A QDQ convolution runs as one int8 kernel (ONNX Runtime renames it "conv_token_<n>" and renames every tensor):
    it covers the DequantizeLinear of its input and weights and the QuantizeLinear of its output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    constants = {"s_x": np.float32(0.02), "z_x": np.uint8(128), "s_w": np.float32(0.005), "z_w": np.int8(0),
                 "w_q": rng.integers(-100, 100, (16, 16, 3, 3)).astype(np.int8), "s_y": np.float32(0.05),
                 "z_y": np.uint8(128)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"], "quant_x"),
             helper.make_node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xd"], "dequant_x"),
             helper.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["wd"], "dequant_w"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s_y", "z_y"], ["cq"], "quant_y"),
             helper.make_node("DequantizeLinear", ["cq", "s_y", "z_y"], ["y"], "dequant_y")]
    shape: list[str | int | None] = ["N", 16, 8, 8]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save_model(model, tmp_path / "qdq.onnx")
    run = RunRequest(runtime=runtime, device="cpu", precision="int8", params={}, threads=1, task="inference",
                     onnx_path=str(tmp_path / "qdq.onnx"), zoo=None, batch_size=2, input_shapes={"x": [16, 8, 8]},
                     workdir=str(tmp_path))
    kinds = check_profile(profiled(run), source, tuple(n.name for n in nodes))
    assert kinds[("dequant_x", "dequant_w", "conv", "quant_y")].startswith(kind)


def _measure_profile(run: RunRequest, tmp_path: Path, *args: str) -> tuple[int, dict]:
    """``modak measure --profile`` as ``modak bench`` starts it: the deployment through the launcher."""
    deployment = Deployment(runtime=run.runtime, device=run.device, precision=run.precision, task=run.task,
                            params={**run.params, "threads": run.threads}, env={}, batch_size=run.batch_size,
                            input_shapes=run.input_shapes, zoo=None)
    (tmp_path / "plan.json").write_text(json.dumps({"deployment": deployment.to_dict()}))
    env = {**os.environ, "MODAK_PLAN": str(tmp_path / "plan.json"), "MODAK_MODEL": run.onnx_path,
           "MODAK_WORKDIR": run.workdir}
    done = subprocess.run([sys.executable, "-m", "modak.image.launch", "--", sys.executable, "-m", "modak.runtime",
                           "measure", *args], capture_output=True, text=True, timeout=120, env=env)
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else {"stderr": done.stderr}


def test_measure_profile_through_the_launcher(tmp_path):
    code, report = _measure_profile(request(tmp_path, "onnxruntime"), tmp_path, "--profile", "3")
    assert code == 0, report
    assert report["status"] == "ok" and report["threads"] == 1 and report["protocol"]["profile_steps"] == 3
    assert "step_median_s" not in report and "max_abs_error" not in report  # no timing, no check
    profile = Profile.from_json(json.dumps(report["profile"]))
    assert profile.steps == 3 and profile.kernel_seconds() <= profile.step_seconds
    assert {n for k in profile.kernels for n in k.kernel.nodes} == set(CONV_BN_RELU_NODES)

    code, report = _measure_profile(request(tmp_path, "xla"), tmp_path, "--profile", "3")  # xla has no profile
    assert code == 3 and report["status"] == "error" and report["error"] == "runtime xla reports no profile"

    code, report = _measure_profile(request(tmp_path, "onnxruntime"), tmp_path, "--profile", "0")
    assert code == 2 and "positive whole number of steps" in report["stderr"]


def test_load_profiler():
    assert load_profiler("onnxruntime") is ort_runtime.profile
    assert load_profiler("openvino") is ov_runtime.profile
    assert load_profiler("xla") is None
