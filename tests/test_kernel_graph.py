"""The kernels a runtime reports for a graph at plan time (modak.workload.kernels): the real ONNX Runtime, OpenVINO
and PyTorch on a Conv+BatchNormalization+ReLU graph and a zoo CNN."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from modak.image.onnx_nodes import shape_static_nodes
from modak.image.runtimes.base import adapters
from modak.paths import cache_dir
from modak.workload.analysis import analyze
from modak.workload.kernels import UnreportedGraph, planned_kernels
from modak.workload.zoo import export_onnx
from tests.support.specs import CPU_TARGET, MIXER_MODULE

NODES = ("conv", "bn", "relu")


@pytest.fixture(scope="module")
def cbr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Conv (3x3, bias) -> BatchNormalization -> Relu over a dynamic batch of 8x16x16 inputs."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    variance = numpy_helper.from_array((np.abs(rng.standard_normal(16)) + 1).astype(np.float32), "var")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"], name="bn"),
         helper.make_node("Relu", ["n"], ["y"], name="relu")],
        "cbr", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 8, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [weight("w", 16, 8, 3, 3), weight("b", 16), weight("scale", 16), weight("shift", 16), weight("mean", 16),
         variance])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path_factory.mktemp("cbr") / "cbr.onnx"
    onnx.save(model, path)
    return path


def _nchwc_block() -> int | None:
    """MLAS's NCHWc channel block on this host (its vector width in floats), or None where it has no NCHWc kernels."""
    import archspec.cpu

    features = archspec.cpu.host().features
    return 16 if "avx512f" in features else 8 if "avx2" in features else None


def _report(runtime: str, path: Path, batch: int = 4, **kwargs):
    return planned_kernels(runtime, path, batch, {}, "fp32", 1, **kwargs)


def test_onnxruntime_basic_level_folds_the_batchnorm_into_the_conv(cbr: Path) -> None:
    kernels = _report("onnxruntime", cbr, params={"graph_optimization": "basic"})
    profile = analyze(cbr, 4)
    flops = {op.name: op.flops for op in profile.ops}
    assert [(k.kind, k.op, k.nodes) for k in kernels] == [("Conv", "conv", ("conv", "bn")),
                                                         ("Relu", "elementwise", ("relu",))]
    conv = kernels[0]
    assert conv.shapes == ((4, 8, 16, 16), (16, 8, 3, 3), (16,))  # at the job's batch; the folded weights
    assert json.loads(conv.attributes) == {"auto_pad": "NOTSET", "group": 1, "kernel_shape": [3, 3],
                                           "pads": [1, 1, 1, 1]}
    assert conv.flops == flops["conv"] + flops["bn"] and kernels[1].flops == flops["relu"]


def test_onnxruntime_all_level_fuses_conv_batchnorm_relu_into_one_kernel(cbr: Path) -> None:
    """ORT's default level: one fused kernel covers the three nodes: FusedConv, or the NCHWc Conv and its layout
    reorders where MLAS has NCHWc kernels. Their channel block is the host's vector width (16 floats with AVX-512,
    8 with AVX2): the input's 8 channels fill a block of 8, so an AVX2 host reorders the input too, where an
    AVX-512 host reads it as it is."""
    kernels = _report("onnxruntime", cbr)
    shapes = ((4, 8, 16, 16), (16, 8, 3, 3), (16,))
    described = [(k.kind, k.op, k.nodes, json.loads(k.attributes).get("activation")) for k in kernels]
    fused = [("FusedConv", "conv", NODES, "Relu")]
    nchwc = [("nchwc.Conv", "conv", NODES, "Relu"), ("nchwc.ReorderOutput", "data_movement", (), None)]
    expected = {16: [fused, nchwc], 8: [fused, [("nchwc.ReorderInput", "data_movement", (), None), *nchwc]]}
    assert described in expected.get(_nchwc_block(), [fused])
    conv = next(k for k in kernels if k.op == "conv")
    assert conv.shapes[0] == shapes[0] and conv.flops == analyze(cbr, 4).forward_flops


def test_openvino_maps_its_fused_convolution_to_the_three_nodes(cbr: Path) -> None:
    kernels = _report("openvino", cbr)
    covering = [k for k in kernels if k.nodes]
    assert len(covering) == 1
    conv = covering[0]
    assert conv.nodes == NODES and conv.op == "conv"
    assert conv.kind.startswith("Convolution:")  # and the plugin's primitive, e.g. brgconv_avx512_f32
    assert conv.shapes[0] == (4, 8, 16, 16) and conv.flops == analyze(cbr, 4).forward_flops
    assert all(k.kind.startswith("Reorder:") and k.op == "data_movement" for k in kernels if k is not conv)


@pytest.fixture(scope="module")
def residual(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conv_a+bn_a+relu_a -> conv_b+bn_b, add (the residual relu_a), relu_b -> conv_c, SiLU (sig, mul)."""
    rng = np.random.default_rng(1)
    nodes, weights = [], []

    def conv(name: str, x: str, y: str, channels_in: int) -> None:
        nodes.append(helper.make_node("Conv", [x, f"{name}.w"], [y], name=name, kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1]))
        weights.append(numpy_helper.from_array(rng.standard_normal((16, channels_in, 3, 3)).astype(np.float32),
                                               f"{name}.w"))

    def batchnorm(name: str, x: str, y: str) -> None:
        parts = [f"{name}.{p}" for p in ("scale", "shift", "mean", "var")]
        nodes.append(helper.make_node("BatchNormalization", [x, *parts], [y], name=name))
        weights.extend(numpy_helper.from_array((rng.random(16) + 0.5).astype(np.float32), p) for p in parts)

    conv("conv_a", "x", "ca", 8)
    batchnorm("bn_a", "ca", "na")
    nodes.append(helper.make_node("Relu", ["na"], ["r"], name="relu_a"))
    conv("conv_b", "r", "cb", 16)
    batchnorm("bn_b", "cb", "nb")
    nodes += [helper.make_node("Add", ["nb", "r"], ["s"], name="add"),
              helper.make_node("Relu", ["s"], ["rb"], name="relu_b")]
    conv("conv_c", "rb", "cc", 16)
    nodes += [helper.make_node("Sigmoid", ["cc"], ["g"], name="sig"),
              helper.make_node("Mul", ["cc", "g"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "residual",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 8, 16, 16])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], weights)
    path = tmp_path_factory.mktemp("residual") / "residual.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_onnxruntime_epilogues_and_activations_map_to_their_kernels(residual: Path) -> None:
    """The residual add and relu fused into conv_b's kernel, SiLU into QuickGelu: the same nodes whether ORT
    runs NCHWc kernels (renamed tensors, the add and relu fused after the conversion) or FusedConv."""
    kernels = _report("onnxruntime", residual)
    assert [k.nodes for k in kernels if k.nodes] == [("conv_a", "bn_a", "relu_a"), ("conv_b", "bn_b", "add", "relu_b"),
                                                     ("conv_c",), ("sig", "mul")]
    assert [k.kind for k in kernels if k.nodes][-1] == "QuickGelu"


def test_openvino_covers_every_node_once(residual: Path) -> None:
    kernels = _report("openvino", residual)
    covered = [node for k in kernels for node in k.nodes]
    assert sorted(covered) == sorted(op.name for op in analyze(residual, 4).ops)
    assert len(covered) == len(set(covered))
    convolutions = {k.nodes[0]: k.nodes for k in kernels if k.kind.startswith("Convolution:")}
    assert set(convolutions) == {"conv_a", "conv_b", "conv_c"}
    assert convolutions["conv_a"] == ("conv_a", "bn_a", "relu_a")


@pytest.fixture(scope="module")
def mnist() -> Path:
    return export_onnx("mnist_cnn")


def test_aten_ops_of_a_zoo_cnn_on_meta_tensors(mnist: Path) -> None:
    kernels = planned_kernels("pytorch", None, 8, {"input": [1, 28, 28]}, "fp32", 1, zoo="mnist_cnn")
    profile = analyze(mnist, 8, {"input": [1, 28, 28]})
    convs = [k for k in kernels if k.kind == "aten::convolution"]
    assert len(convs) == sum(1 for op in profile.ops if op.op_type == "Conv") == 2
    assert all(k.op == "conv" and k.shapes[0][0] == 8 and not k.nodes for k in convs)
    onnx_conv = sum(op.flops for op in profile.ops if op.op_type == "Conv")  # with 1 FLOP per output for the bias
    assert sum(k.flops for k in convs) == pytest.approx(onnx_conv, rel=0.01)
    matmul = sum(op.flops for op in profile.ops if op.op_class == "matmul")
    assert sum(k.flops for k in kernels if k.op == "matmul") == pytest.approx(matmul, rel=0.01)


def test_aten_ops_of_a_training_step(mnist: Path) -> None:
    """Forward, the built-in loss, backward and a steady SGD-with-momentum update (each parameter's momentum
    buffer scaled in place, none created)."""
    from modak.image.zoo import get_entry

    kernels = planned_kernels("pytorch", mnist, 8, {"input": [1, 28, 28]}, "fp32", 1, zoo="mnist_cnn",
                              task="training", loss="cross_entropy")
    kinds = [k.kind for k in kernels]
    parameters = len(list(get_entry("mnist_cnn").build().parameters()))
    assert kinds.count("aten::convolution") == kinds.count("aten::convolution_backward") == 2
    assert "aten::nll_loss_forward" in kinds and "aten::nll_loss_backward" in kinds
    assert kinds.count("aten::mul_") == parameters and "aten::clone" not in kinds
    inference = planned_kernels("pytorch", mnist, 8, {"input": [1, 28, 28]}, "fp32", 1, zoo="mnist_cnn")
    # the backward pass: gradients of the activations (not the input's) and of the weights, about 2x the forward
    assert sum(k.flops for k in kernels) == pytest.approx(3 * sum(k.flops for k in inference), rel=0.05)
    with pytest.raises(UnreportedGraph, match="own loss function"):
        planned_kernels("pytorch", mnist, 8, {"input": [1, 28, 28]}, "fp32", 1, zoo="mnist_cnn", task="training",
                        loss="losses.py:my_loss")


def test_flops_add_up_to_the_analysis(mnist: Path) -> None:
    """Every node the analysis costs is in one kernel, except the constants the runtimes fold (no FLOPs)."""
    profile = analyze(mnist, 8, {"input": [1, 28, 28]})
    for runtime in ("onnxruntime", "openvino"):
        kernels = planned_kernels(runtime, mnist, 8, {"input": [1, 28, 28]}, "fp32", 1)
        covered = [node for k in kernels for node in k.nodes]
        assert len(covered) == len(set(covered)), runtime
        uncovered = [op for op in profile.ops if op.name not in covered]
        assert all(op.flops == 0 for op in uncovered), (runtime, uncovered)
        assert sum(k.flops for k in kernels) == profile.forward_flops, runtime
        assert sum(k.bytes for k in kernels) + sum(op.bytes for op in uncovered) == profile.forward_bytes


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list:
    """The models ONNX Runtime sessions are built of, in this test (each ``InferenceSession`` counted)."""
    import onnxruntime

    models: list = []
    session = onnxruntime.InferenceSession

    def counted(*args, **kwargs):
        models.append(args[0])
        return session(*args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", counted)
    return models


def test_a_second_report_comes_from_the_cache(cbr: Path, built: list) -> None:
    folder = cache_dir() / "kernels"
    before = set(folder.iterdir()) if folder.is_dir() else set()
    first = _report("onnxruntime", cbr, batch=3)
    assert _report("onnxruntime", cbr, batch=3) == first and len(built) == 1
    (entry,) = set(folder.iterdir()) - before
    _report("onnxruntime", cbr, batch=5)  # another batch, another answer
    assert len(built) == 2
    entry.write_text("{damaged")
    assert _report("onnxruntime", cbr, batch=3) == first and len(built) == 3  # a damaged entry is asked again


def test_the_users_own_model_is_traced_in_a_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's module runs only in a child process (never imported here), at the job's batch; a second plan
    reads the cache; a model the trace cannot run is no kernels, not an error of the plan."""
    import sys

    from modak.spec.loader import load_job

    (tmp_path / "target.yaml").write_text(CPU_TARGET)
    (tmp_path / "model.py").write_text(MIXER_MODULE)
    (tmp_path / "job.yaml").write_text(
        "apiVersion: modak/v1\nkind: Job\nname: own\ntarget: target.yaml\ntask: training\nmodel:\n"
        "  pytorch: {module: model.py, factory: build_model, kwargs: {width: 8}}\n  input_shape: [3, 16, 16]\n"
        "  batch_size: 4\n")
    loaded = load_job(tmp_path / "job.yaml")
    kernels = planned_kernels("pytorch", None, 6, {"input": [3, 16, 16]}, "fp32", 1, user=loaded, task="training")
    assert "model" not in sys.modules
    kinds = [k.kind for k in kernels]
    assert kinds.count("aten::convolution") == kinds.count("aten::convolution_backward") == 1
    conv = kernels[kinds.index("aten::convolution")]
    assert conv.shapes[:2] == ((6, 3, 16, 16), (8, 3, 3, 3)) and conv.flops == 2 * 6 * 8 * 16 * 16 * 3 * 3 * 3
    monkeypatch.setattr("modak.workload.kernels._CHILD", "no.such.module")  # a second plan starts no child
    assert planned_kernels("pytorch", None, 6, {"input": [3, 16, 16]}, "fp32", 1, user=loaded,
                           task="training") == kernels
    (tmp_path / "model.py").write_text(MIXER_MODULE.replace("return Mixer(width)", "raise ValueError('no')"))
    monkeypatch.undo()
    with pytest.raises(UnreportedGraph, match="could not trace"):
        planned_kernels("pytorch", None, 6, {"input": [3, 16, 16]}, "fp32", 1, user=load_job(tmp_path / "job.yaml"))


def test_runtimes_without_a_report(cbr: Path) -> None:
    with pytest.raises(UnreportedGraph, match="tvm does not report"):
        _report("tvm", cbr)
    with pytest.raises(UnreportedGraph, match="not an ONNX file"):
        _report("pytorch", cbr)
    with pytest.raises(UnreportedGraph, match="has none"):
        planned_kernels("openvino", None, 1, {}, "fp32", 1)


@pytest.fixture(scope="module")
def learned_queries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DETR's pattern: learned queries broadcast to the input's batch (Shape, Gather, Concat, Expand), projected
    (MatMul), then added to the input: at a fixed batch, everything but the Add is a constant. A node of constants
    alone (Neg of the weight) is constant whatever the shapes."""
    rng = np.random.default_rng(2)
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
         helper.make_node("Gather", ["shape", "zero"], ["batch"], name="batch", axis=0),
         helper.make_node("Concat", ["batch", "rest"], ["target"], name="target", axis=0),
         helper.make_node("Expand", ["queries", "target"], ["q"], name="expand"),
         helper.make_node("MatMul", ["q", "w"], ["p"], name="project"),
         helper.make_node("Add", ["x", "p"], ["y"], name="add"),
         helper.make_node("Neg", ["w"], ["negated"], name="negate")],
        "queries", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 16, 32])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([16, 32], np.int64), "rest"),
         numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "queries"),
         numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "w")])
    path = tmp_path_factory.mktemp("queries") / "queries.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_the_nodes_the_input_shapes_fix(learned_queries: Path) -> None:
    graph = onnx.load(learned_queries).graph
    assert shape_static_nodes(graph) == {"shape", "batch", "target", "expand", "project"}


def test_openvino_kernels_leave_out_what_it_computes_when_compiling() -> None:
    """detr_r18's first decoder layer runs on its learned queries: at the job's batch OpenVINO computes it when
    compiling, under a constant of its own name, so no executed layer names those nodes. No kernel covers them
    (the mapping once absorbed them, 82 MFLOPs, into the elementwise Subgraph that follows)."""
    graph_path = export_onnx("detr_r18")
    static = shape_static_nodes(onnx.load(graph_path, load_external_data=False).graph)
    flops = {op.name: op.flops for op in analyze(graph_path, 1).ops}
    assert sum(flops[n] for n in static) > 80e6  # the decoder layer, computed once
    kernels = _report("openvino", graph_path, batch=1)
    assert not static & {n for k in kernels for n in k.nodes}
    after = next(k for k in kernels if "/decoder.0/Add" in k.nodes)
    assert after.kind.startswith("Subgraph:") and after.flops < 1e6


def test_a_models_digest_is_read_once_per_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan asks for each candidate's report: the model file is hashed once, then its digest is found by its
    path, size, modification time and inode (#65: a 100 MB model was read and hashed ten times a plan)."""
    import hashlib
    import os

    from modak import paths

    model = tmp_path / "model.onnx"
    model.write_bytes(b"graph one")
    hashed = []
    file_digest = hashlib.file_digest

    def counted(handle, name):
        hashed.append(handle.name)
        return file_digest(handle, name)

    monkeypatch.setattr(hashlib, "file_digest", counted)
    first = paths.file_digest(model)
    assert first == hashlib.sha256(b"graph one").hexdigest() and len(hashed) == 1
    assert paths.file_digest(model) == first and len(hashed) == 1  # found, not read
    status = model.stat()
    model.write_bytes(b"graph two")  # the same size, other bytes, written later
    os.utime(model, ns=(status.st_atime_ns, status.st_mtime_ns + 1))
    assert paths.file_digest(model) == hashlib.sha256(b"graph two").hexdigest() and len(hashed) == 2
    with pytest.raises(OSError):
        paths.file_digest(tmp_path / "missing.onnx")


def test_a_plans_candidates_load_and_analyze_the_graph_once(cbr: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ONNX candidate's report needs the graph's input shapes and its nodes' costs: one load and one analysis
    per file content, batch and shapes, whatever the candidates' runtimes and parameters (#65: a 100 MB model was
    parsed and inferred 33 times in a plan); a changed file is analyzed again."""
    import shutil

    from modak.workload import kernels

    loads = []
    load = kernels.load_model
    monkeypatch.setattr(kernels, "load_model", lambda path: loads.append(path) or load(path))
    model = tmp_path / "cbr.onnx"
    shutil.copy(cbr, model)
    assert _report("onnxruntime", model, batch=7) and _report("openvino", model, batch=7)
    assert planned_kernels("onnxruntime", model, 7, {}, "fp32", 2)  # other threads: another report
    assert len(loads) == 1
    _report("onnxruntime", model, batch=9)  # another batch: other shapes
    assert len(loads) == 2
    graph = onnx.load(model)
    graph.graph.node[2].op_type = "Sigmoid"  # another file at the same path
    onnx.save(graph, model)
    _report("onnxruntime", model, batch=9)
    assert len(loads) == 3  # the changed file, analyzed again


@pytest.mark.parametrize("runtime", [name for name, found in adapters().items() if found.kernels is not None])
def test_a_runtimes_run_settings_do_not_change_the_kernels_it_plans(runtime: str, cbr: Path, mnist: Path,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each value the recipe gives a parameter the runtime declares a run setting, and 1 or 2 threads, plan the
    same kernels (each asked afresh, no cache), so candidates that differ only in them may share one report."""
    import modak.workload.kernels as kernels_module
    from modak.candidates.catalog import load_catalog
    from modak.image.runtimes.base import adapter

    fresh = iter(range(1000))
    monkeypatch.setattr(kernels_module, "cache_dir", lambda: tmp_path / str(next(fresh)))
    settings = adapter(runtime).run_settings
    cpu = [p for p in load_catalog()[runtime].parameters if "cpu" in p.devices and not p.precisions]
    assert set(settings) <= {p.name for p in load_catalog()[runtime].parameters}
    base = {p.name: p.values[0] for p in cpu}
    traced = adapter(runtime).kernels == "torch"

    def report(params: dict, threads: int) -> tuple:
        if traced:
            return planned_kernels(runtime, None, 4, {"input": [1, 28, 28]}, "fp32", threads, params=params,
                                   zoo="mnist_cnn")
        return _report(runtime, cbr, params=params) if threads == 1 else planned_kernels(
            runtime, cbr, 4, {}, "fp32", threads, params=params)

    first = report(base, 1)
    assert first and report(base, 2) == first
    varied = [(p.name, value) for p in cpu if p.name in settings for value in p.values[1:]]
    assert varied or settings == ("threads",)
    for name, value in varied:
        assert report({**base, name: value}, 1) == first, (name, value)


def test_candidates_that_differ_in_run_settings_share_one_report(cbr: Path, built: list) -> None:
    settings = {"threads": "all", "wait_policy": "spin", "allocator": "default", "graph_optimization": "all"}
    first = planned_kernels("onnxruntime", cbr, 6, {}, "fp32", 2, params=settings)
    again = planned_kernels("onnxruntime", cbr, 6, {}, "fp32", 1,
                            params={**settings, "threads": "half", "wait_policy": "passive", "allocator": "jemalloc"})
    assert again == first and len(built) == 1
    basic = planned_kernels("onnxruntime", cbr, 6, {}, "fp32", 2, params={**settings, "graph_optimization": "basic"})
    assert basic != first and len(built) == 2  # a parameter that changes the graph is another report
