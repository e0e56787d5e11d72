"""The profiles of the PyTorch family and TVM (#40): each runtime's ``profile`` on a real profiled run of a tiny
zoo model, and the name parsing it relies on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import onnx
import pytest

from modak.image.kernels import OP_CLASSES, Profile
from modak.image.runtimes.base import Adapter, RunRequest, adapter, make_inputs
from modak.image.runtimes.profiling import median_step, op_class
from modak.image.zoo import get_entry
from modak.workload.zoo import export_onnx

STEPS = 3


def profiled(runtime: str, zoo: str, task: str, workdir: Path,
             shapes: Mapping[str, tuple[int, ...]] | None = None, **params: object) -> tuple[Profile, RunRequest]:
    """The profile of ``runtime`` running ``zoo`` (batch 2, fp32; the zoo's input shapes unless ``shapes``),
    checked for what every profile must hold."""
    given = shapes or get_entry(zoo).input_shapes
    request = RunRequest(runtime=runtime, device="cpu", precision="fp32", params=dict(params), threads=None,
                         task=task, onnx_path=str(export_onnx(zoo, given)), zoo=zoo, batch_size=2,
                         input_shapes={k: list(v) for k, v in given.items()}, workdir=str(workdir))
    assert adapter(runtime).implements(Adapter.profile), f"{runtime} has no profile"
    found = adapter(runtime).profile(request, make_inputs(request), STEPS)
    assert isinstance(found, Profile) and found.steps == STEPS and found.kernels
    assert all(k.seconds > 0 and k.calls >= 1 and k.kernel.op in OP_CLASSES for k in found.kernels)
    assert len({k.kernel for k in found.kernels}) == len(found.kernels)  # one entry per kernel
    # The kernels ran inside the step, and what ran outside them too.
    assert found.unmapped_seconds >= 0
    assert found.kernel_seconds() + found.unmapped_seconds <= found.step_seconds
    assert all(k.kernel.flops == 0.0 and k.kernel.bytes == 0.0 for k in found.kernels)  # the host fills them
    assert Profile.from_json(found.to_json()) == found
    return found, request


def graph_nodes(request: RunRequest) -> dict[str, str]:
    """ONNX node name -> op type of the request's graph."""
    return {n.name: n.op_type for n in onnx.load(request.onnx_path, load_external_data=False).graph.node}


@pytest.mark.slow
def test_pytorch_inference_ops_map_to_the_onnx_nodes_of_their_modules(tmp_path):
    found, request = profiled("pytorch", "mnist_cnn", "inference", tmp_path, channels_last=True)
    assert found.source == "torch-profiler"
    by_node = {k.kernel.nodes: k.kernel for k in found.kernels if k.kernel.nodes}
    # Each convolution, linear layer, ReLU and pooling maps to its own node; the flatten (a view) to none.
    nodes = graph_nodes(request)
    assert sorted(n for covered in by_node for n in covered) == sorted(n for n, t in nodes.items() if t != "Flatten")
    conv = by_node[("/conv2/Conv",)]
    assert (conv.kind, conv.op) == ("aten::convolution", "conv")
    assert conv.shapes[:3] == ((2, 32, 14, 14), (64, 32, 3, 3), (64,))
    attributes = json.loads(conv.attributes)
    assert attributes == {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "transposed": False,
                          "output_padding": [0, 0], "groups": 1, "channels_last": True}  # as the candidate asked
    assert by_node[("/fc1/Gemm",)].kind == "aten::addmm"
    assert by_node[("/Relu_1",)].kind == "aten::relu" and by_node[("/MaxPool_1",)].op == "pooling"
    # aten::linear is a decomposition: its ops are the kernels, never it
    assert not {k.kernel.kind for k in found.kernels} & {"aten::linear", "aten::conv2d"}


@pytest.mark.slow
def test_pytorch_ops_map_to_nodes_in_nested_modules(tmp_path):
    found, request = profiled("pytorch", "resnet18", "inference", tmp_path, {"input": (3, 32, 32)})
    covered = {n: k.kernel.kind for k in found.kernels for n in k.kernel.nodes}
    nodes = graph_nodes(request)
    # every node but the flatten, down to the residual blocks' sequential downsampling
    assert sorted(covered) == sorted(n for n, t in nodes.items() if t != "Flatten")
    assert covered["/layer2/layer2.0/downsample/downsample.0/Conv"] == "aten::convolution"
    assert covered["/layer2/layer2.0/bn1/BatchNormalization"] == "aten::native_batch_norm"
    assert covered["/layer2/layer2.0/Add"] == "aten::add"
    assert [covered[n] for n, t in nodes.items() if t == "GlobalAveragePool"] == ["aten::mean"]


@pytest.mark.slow
def test_pytorch_training_profiles_backward_and_optimizer_ops(tmp_path):
    found, request = profiled("pytorch", "mnist_cnn", "training", tmp_path)
    kernels = [k.kernel for k in found.kernels]
    kinds = {k.kind for k in kernels}
    assert {"aten::convolution", "aten::convolution_backward", "aten::threshold_backward",
            "aten::max_pool2d_with_indices_backward", "aten::mm"} <= kinds
    # Backward ops cover their forward op's node; the weight gradient of conv1 is its own kernel
    backward = [k for k in kernels if k.kind == "aten::convolution_backward"]
    assert sorted(k.nodes for k in backward) == [("/conv1/Conv",), ("/conv2/Conv",)]
    assert all(k.op == "conv" for k in backward)
    gemms = {n for n, t in graph_nodes(request).items() if t == "Gemm"}
    assert {n for k in kernels if k.kind == "aten::mm" for n in k.nodes} == gemms
    # SGD with momentum updates every parameter in place, shaped like it: conv2's weight among them
    updates = {k.shapes[0] for k in kernels if k.kind in ("aten::add_", "aten::mul_") and not k.nodes}
    assert (64, 32, 3, 3) in updates and (128, 3136) in updates


@pytest.mark.slow
def test_torch_compile_reports_fused_kernels_and_their_source_ops(tmp_path):
    found, _ = profiled("torch-compile", "mlp", "inference", tmp_path)
    fused = [k.kernel for k in found.kernels if k.kernel.kind.startswith("cpp_fused_")]
    assert fused, [k.kernel.kind for k in found.kernels]
    for kernel in fused:
        assert not kernel.kind[-1].isdigit()  # the per-graph suffix stripped
        sources = json.loads(kernel.attributes)["aten"]
        assert sources and all(s.startswith("aten::") and s[6:] in kernel.kind for s in sources)
    assert any(json.loads(k.attributes)["aten"] == ["aten::relu"] for k in fused)
    # The matrix products Inductor leaves to aten keep their shapes; nothing maps to ONNX nodes, as noted
    addmm = [k.kernel for k in found.kernels if k.kernel.kind == "aten::addmm"]
    assert ((2, 784), (784, 1024)) == addmm[0].shapes[1:3]
    assert not any(k.kernel.nodes for k in found.kernels)
    assert any("not mapped to ONNX nodes" in note for note in found.notes)


@pytest.mark.slow
def test_tvm_reports_its_primitives(tmp_path):
    found, _ = profiled("tvm", "mlp", "inference", tmp_path, tuning_trials=0)
    assert found.source == "tvm-vm-instrument"
    matmuls = [k for k in found.kernels if k.kernel.op == "matmul"]
    assert {k.kernel.kind for k in matmuls} == {"matmul"} and sum(k.calls for k in matmuls) == 3  # three layers
    # arguments, then the output (destination-passing): the first layer's
    assert ((2, 784), (784, 1024), (2, 1024)) in {k.kernel.shapes for k in matmuls}
    assert all(not k.kernel.kind.startswith("vm.") and not k.kernel.nodes for k in found.kernels)
    assert found.unmapped_seconds > 0  # the VM's builtins (allocation, shape checks)


def test_inductor_kernel_names_split_into_their_source_ops():
    from modak.image.runtimes.torch_kernels import inductor_sources

    assert inductor_sources("cpp_fused__native_batch_norm_legit_functional_copy__relu_threshold_backward") == [
        "aten::_native_batch_norm_legit_functional", "aten::copy_", "aten::relu", "aten::threshold_backward"]
    assert inductor_sources("triton_poi_fused_add_relu") == ["aten::add", "aten::relu"]
    assert inductor_sources("cpp_fused_convolution_backward_sum") == ["aten::convolution_backward", "aten::sum"]
    assert inductor_sources("cpp_fused") == [] and inductor_sources("cpp_fused_not_an_op_xyz") == []


@pytest.mark.parametrize("name, expected", [
    ("aten::convolution_backward", "conv"), ("fused_conv2d_add_relu", "conv"), ("aten::addmm", "matmul"),
    ("cpp_fused_max_pool2d_with_indices_relu", "pooling"), ("aten::native_batch_norm", "normalization"),
    ("aten::threshold_backward", "elementwise"), ("aten::t", "data_movement"), ("aten::lift_fresh", "other"),
    ("aten::_softmax", "softmax"), ("cpp_fused__softmax_add", "softmax"), ("aten::sum", "reduction"),
    ("aten::embedding", "embedding"), ("cpp_fused_add_native_batch_norm", "normalization"),
])
def test_op_class_of_kernel_names(name, expected):
    assert op_class(name) == expected


def test_the_name_priority_orders_every_op_class():
    from modak.image.runtimes.profiling import PRIORITY

    assert sorted(PRIORITY) == sorted(set(OP_CLASSES) - {"other"}) and len(PRIORITY) == len(set(PRIORITY))


def test_median_step_is_the_lower_median():
    assert median_step([3.0, 1.0, 2.0]) == 2
    assert median_step([4.0, 1.0, 3.0, 2.0]) == 3
    with pytest.raises(ValueError):
        median_step([])


def test_calls_map_to_the_nodes_of_their_scope_in_order(tmp_path):
    """The mapping a profile and a plan's trace share: the k-th op of a kind in a module's scope to the k-th node of
    its ONNX op types there, only where the counts agree; a call without a scope (backward) maps to none."""
    from onnx import TensorProto, helper

    from modak.image.runtimes.torch_kernels import inner_scope, onnx_nodes

    names = ["/fc1/Gemm", "/Relu", "/fc2/Gemm", "/fc2/Relu", "/fc2/Relu_1"]
    nodes = [helper.make_node(name.rpartition("/")[2].split("_")[0], [f"t{i}"], [f"t{i + 1}"], name=name)
             for i, name in enumerate(names)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info(f"t{len(names)}", TensorProto.FLOAT, [1])])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph), path)
    assert inner_scope(None, "") == "" and inner_scope("", "fc2") == "/fc2"
    assert inner_scope("/layer2", "layer2.0") == "/layer2/layer2.0"
    calls = [("aten::t", "/fc1"), ("aten::addmm", "/fc1"), ("aten::relu", ""), ("aten::addmm", "/fc2"),
             ("aten::relu", "/fc2"), ("aten::relu", None)]
    # /fc2 holds two Relu nodes and one relu call in scope: not mapped, rather than mapped to the wrong one
    assert onnx_nodes(calls, str(path)) == {1: ("/fc1/Gemm",), 2: ("/Relu",), 3: ("/fc2/Gemm",)}
