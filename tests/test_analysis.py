"""Workload analysis: published counts, a hand-computed graph, training totals, and the job's model source."""

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

from modak.api import load as load_job
from modak.errors import InputError
from modak.image.kernels import OP_CLASSES
from modak.spec.models import Task
from modak.workload import zoo
from modak.workload.analysis import OpStats, analyze, format_table
from modak.workload.source import load_analysis, resolve_model

pytest.importorskip("torch")  # the zoo exports need it


@pytest.fixture(scope="module")
def profile():
    """``profile(name, batch)``: the inference profile of a zoo model, computed once."""
    cache = {}

    def get(name: str, batch: int = 1):
        if (name, batch) not in cache:
            cache[name, batch] = analyze(zoo.export_onnx(name), batch)
        return cache[name, batch]
    return get


def macs_of(profile, *op_classes):
    return sum(op.macs for op in profile.ops if op.op_class in op_classes)


# --- published counts ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name, gmacs, params, torchvision_params", [
    ("resnet50", 4.1, 25.6e6, 25_557_032),
    ("resnet18", 1.8, 11.7e6, 11_689_512),
    ("mobilenet_v2", 0.300, 3.5e6, 3_504_872),
])
def test_vision_models_match_published_counts(profile, name, gmacs, params, torchvision_params):
    p = profile(name)
    assert macs_of(p, "conv", "matmul") == pytest.approx(gmacs * 1e9, rel=0.02)
    conv_gemm_flops = sum(op.flops for op in p.ops if op.op_class in ("conv", "matmul"))
    assert conv_gemm_flops == pytest.approx(2 * gmacs * 1e9, rel=0.02)
    assert p.parameters == pytest.approx(params, rel=0.01)
    # BatchNorm running statistics are buffers, not parameters, as in torchvision's count.
    assert p.parameters == torchvision_params
    assert p.parameter_bytes == 4 * p.parameters


@pytest.mark.slow
def test_bert_base_matches_published_counts(profile):
    p = profile("bert_base")
    matmuls = [op for op in p.ops if op.op_type == "MatMul"]
    # Per layer: Q, K, V and output projections 4*128*768*768, FFN 2*128*768*3072, scores and context 2*128*128*768.
    per_layer = 4 * 128 * 768 * 768 + 2 * 128 * 768 * 3072 + 2 * 128 * 128 * 768
    assert sum(op.macs for op in matmuls) == 12 * per_layer
    assert sum(op.macs for op in matmuls) == pytest.approx(11.2e9, rel=0.02)
    assert sum(op.flops for op in matmuls) == pytest.approx(22.4e9, rel=0.02)
    assert len(matmuls) == 12 * 8 and p.by_op_type()["Softmax"].count == 12
    assert p.parameters == pytest.approx(110e6, rel=0.01)
    assert p.by_op_class()["embedding"].count == 3  # word, position and token-type tables
    # A lookup reads the rows it gathers, not its table (the word table alone is 30522 x 768 x 4 = 94 MB):
    # per table 128 int64 ids, 128 rows of 768 fp32 read (token type: its whole 2-row table) and written.
    rows = 128 * 768 * 4
    assert p.by_op_class()["embedding"].bytes == 3 * 128 * 8 + 2 * rows + 2 * 768 * 4 + 3 * rows


# --- a graph computed by hand ---------------------------------------------------------------------------

def tiny_model() -> onnx.ModelProto:
    """x (N,3,8,8) -> Conv 4x3x3x3 + bias, pad 1 -> Relu -> Flatten -> Gemm 256->10 + bias."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w", (4, 3, 3, 3)), ("b", (4,)), ("fc_w", (10, 256)), ("fc_b", (10,)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_tiny_graph_exact_counts():
    p = analyze(tiny_model(), 2)
    conv, relu, flatten, fc = p.ops
    # Conv: 2*4*8*8 = 512 outputs x 27 MACs; 2 FLOPs per MAC + 1 per output for the bias.
    assert conv == OpStats("conv", "Conv", "conv", macs=13_824, flops=28_160, input_bytes=1_536,
                           weight_bytes=(108 + 4) * 4, output_bytes=2_048)
    assert relu == OpStats("relu", "Relu", "elementwise", 0, 512, 2_048, 0, 2_048)
    assert flatten == OpStats("flatten", "Flatten", "data_movement", 0, 0, 2_048, 0, 2_048)
    # Gemm: 2x10 outputs x 256 MACs, bias 20.
    assert fc == OpStats("fc", "Gemm", "matmul", 5_120, 10_260, 2_048, (2_560 + 10) * 4, 80)
    assert conv.bytes == 1_536 + 448 + 2_048
    assert (p.parameters, p.parameter_bytes) == (2_682, 10_728)
    assert (p.forward_flops, p.forward_bytes) == (38_932, 24_632)
    assert (p.flops, p.bytes) == (38_932, 24_632)
    assert p.input_shapes == {"x": (3, 8, 8)} and p.model_name == "tiny"

    train = analyze(tiny_model(), 2, task=Task.training, optimizer="sgd_momentum")
    assert train.flops == 3 * 38_932 + 4 * 2_682  # forward + 2x backward + 4 FLOPs per parameter
    assert train.bytes == 3 * 24_632 + 5 * 10_728  # p, g, v read; p, v written
    adam = analyze(tiny_model(), 2, task="training", optimizer="adam")
    assert adam.flops == 3 * 38_932 + 12 * 2_682


@pytest.mark.slow
def test_lstm_language_model_counts_its_recurrence_as_its_own_class(profile):
    p = profile("lstm_lm")
    (first, second) = [op for op in p.ops if op.op_type == "LSTM"]
    # Per step and gate: input (256, then 512 wide) and recurrent (512) products into 512 units, 4 gates, 64 steps.
    assert first.macs == 64 * 4 * 512 * (256 + 512) and second.macs == 64 * 4 * 512 * (512 + 512)
    assert {op.op_class for op in (first, second)} == {"recurrent"} and "recurrent" in OP_CLASSES
    head = next(op for op in p.ops if op.op_type in ("Gemm", "MatMul"))
    assert head.op_class == "matmul" and head.macs == 512 * 10_000


def test_op_rules():
    ones = [numpy_helper.from_array(np.ones(shape, np.float32), name)
            for name, shape in (("b", (4, 5)), ("e", (2, 4, 6)), ("wt", (2, 3, 3, 3)), ("g", (5,)), ("be", (5,)))]
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"], name="mm"),
             helper.make_node("Einsum", ["a", "e"], ["es"], name="einsum", equation="nhij,hjk->nhik"),
             helper.make_node("Einsum", ["a", "a"], ["el"], name="ellipsis", equation="...ij,...kj->...ik"),
             helper.make_node("ConvTranspose", ["x", "wt"], ["ct"], name="deconv", strides=[2, 2]),
             helper.make_node("Softmax", ["m"], ["sm"], name="softmax", axis=-1),
             helper.make_node("LayerNormalization", ["m", "g", "be"], ["ln"], name="ln", axis=-1),
             helper.make_node("ReduceMean", ["m"], ["rm"], name="mean", axes=[-1]),
             helper.make_node("MaxPool", ["ct"], ["mp"], name="pool", kernel_shape=[3, 3], strides=[3, 3])]
    graph = helper.make_graph(
        nodes, "ops", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 2, 3, 4]),
                       helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("sm", "ln", "rm", "mp", "es", "el")],
        ones)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    ops = {op.name: op for op in analyze(model, 2).ops}
    assert ops["mm"].macs == 2 * 2 * 3 * 5 * 4  # broadcast batch dims x K
    assert ops["einsum"].macs == 2 * 2 * 3 * 6 * 4  # output elements x the summed j
    assert ops["ellipsis"].macs == 2 * 2 * 3 * 3 * 4
    assert ops["deconv"].macs == 2 * 2 * 4 * 4 * 3 * 9  # input elements x out channels x kernel
    assert ops["deconv"].output_bytes == 2 * 3 * 9 * 9 * 4
    assert ops["softmax"].flops == 5 * 60 and ops["ln"].flops == 8 * 60
    assert ops["mean"].flops == 60  # per input element
    assert ops["pool"].flops == 2 * 3 * 3 * 3 * 9  # window size per output


def test_a_gather_from_an_activation_reads_the_slice_it_gathers():
    """The first token of a sequence (as BERT's pooler takes it): a Gather of one index on axis 1 of an activation
    reads that slice, not the whole activation, and is data movement; a lookup in a weight table is an embedding."""
    table = numpy_helper.from_array(np.ones((10000, 16), np.float32), "table")
    first = numpy_helper.from_array(np.array(0, np.int64), "first")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["h"], name="lookup"),
             helper.make_node("Gather", ["h", "first"], ["cls"], name="first_token", axis=1)]
    graph = helper.make_graph(nodes, "gathers", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 128])],
                              [helper.make_tensor_value_info("cls", TensorProto.FLOAT, None)], [table, first])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    ops = {op.name: op for op in analyze(model, 8).ops}
    slice_bytes = 8 * 16 * 4  # (8, 16) of the (8, 128, 16) activation
    assert ops["first_token"].op_class == "data_movement"
    assert (ops["first_token"].input_bytes, ops["first_token"].weight_bytes, ops["first_token"].output_bytes) \
        == (slice_bytes, 8, slice_bytes)
    assert ops["lookup"].op_class == "embedding"
    assert (ops["lookup"].input_bytes, ops["lookup"].weight_bytes) == (8 * 128 * 8, 8 * 128 * 16 * 4)


def test_groupings_and_table():
    p = analyze(tiny_model(), 4)
    types = p.by_op_type()
    assert list(types)[0] == "Conv"  # most FLOPs first
    assert sum(g.flops for g in types.values()) == p.forward_flops
    assert sum(g.bytes for g in p.by_op_class().values()) == p.forward_bytes
    assert set(p.by_op_class()) <= set(OP_CLASSES)
    assert p.arithmetic_intensity == pytest.approx(p.flops / p.bytes)
    console = Console(record=True, width=120)
    console.print(format_table(p))
    text = console.export_text()
    assert "Conv" in text and "forward" in text and "parameters: 0.00 M" in text


# --- batch scaling and training -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "bert_base", "mobilenet_v2"])
def test_batch_scaling(profile, name):
    one, eight = profile(name, 1), profile(name, 8)
    assert eight.forward_flops == 8 * one.forward_flops
    assert eight.macs == 8 * one.macs
    assert one.forward_bytes < eight.forward_bytes < 8 * one.forward_bytes  # weights are read once per batch
    assert eight.parameters == one.parameters


@pytest.mark.slow
def test_training_costs_at_least_three_forward_passes():
    path = zoo.export_onnx("resnet50")
    inference = analyze(path, 16)
    training = analyze(path, 16, task=Task.training)
    assert inference.flops == inference.forward_flops
    assert training.forward_flops == inference.forward_flops
    assert training.flops >= 3 * training.forward_flops
    assert training.bytes >= 3 * training.forward_bytes
    assert analyze(path, 16, task=Task.training, optimizer="adam").flops > training.flops


def test_analysis_of_cached_resnet50_is_fast():
    path = zoo.export_onnx("resnet50")
    analyze(path, 1)
    start = time.perf_counter()
    analyze(path, 32, task=Task.training)
    assert time.perf_counter() - start < 1.0


# --- shapes and errors ----------------------------------------------------------------------------------

def dynamic_reshape_model() -> onnx.ModelProto:
    """x (batch, seq, 16) -> MatMul 16x32 -> Reshape to (batch, -1) through Shape/Gather/Concat."""
    inits = [numpy_helper.from_array(np.zeros((16, 32), np.float32), "w"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Shape", ["h"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
             helper.make_node("Concat", ["b1", "minus_one"], ["shape"], axis=0),
             helper.make_node("Reshape", ["h", "shape"], ["y"], name="flatten")]
    graph = helper.make_graph(nodes, "dyn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_symbolic_dims_come_from_input_shapes():
    p = analyze(dynamic_reshape_model(), 4, {"x": [10, 16]})
    assert p.ops[0].macs == 4 * 10 * 32 * 16
    assert p.ops[-1].output_bytes == 4 * 320 * 4
    assert p.by_op_class()["data_movement"].count == 5  # Gather on a shape is not an embedding
    with pytest.raises(InputError, match="input 'x' has a symbolic dimension 'seq'"):
        analyze(dynamic_reshape_model(), 4)
    with pytest.raises(InputError, match="no input 'X'; did you mean 'x'"):
        analyze(dynamic_reshape_model(), 4, {"X": [10, 16]})
    with pytest.raises(InputError, match="needs 2 values"):
        analyze(dynamic_reshape_model(), 4, {"x": [10]})
    with pytest.raises(InputError, match="fixed dimension 2 of 16"):
        analyze(dynamic_reshape_model(), 4, {"x": [10, 8]})
    with pytest.raises(InputError, match="unknown optimizer 'adma'; did you mean 'adam'"):
        analyze(dynamic_reshape_model(), 4, {"x": [10, 16]}, Task.training, optimizer="adma")


# --- the job's model source -----------------------------------------------------------------------------

TARGET = """apiVersion: modak/v1
kind: Target
name: box
cpu: {microarchitecture: zen4, cores_per_socket: 8}
memory: {size_gb: 64}
"""


def write_job(folder: Path, model: str, task: str = "inference") -> Path:
    (folder / "target.yaml").write_text(TARGET)
    job = folder / "job.yaml"
    job.write_text(f"apiVersion: modak/v1\nkind: Job\nname: job\ntarget: target.yaml\ntask: {task}\nmodel:\n{model}")
    return job


def test_onnx_file_not_found(tmp_path):
    job = write_job(tmp_path, "  batch_size: 4\n  onnx: nets/missing.onnx\n")
    with pytest.raises(InputError) as info:
        resolve_model(load_job(job))
    assert str(info.value).startswith(f"{job}:8: model.onnx: file not found: ")
    assert str(info.value).endswith(str(tmp_path / "nets" / "missing.onnx"))


def test_onnx_file_not_onnx(tmp_path):
    (tmp_path / "garbage.onnx").write_bytes(bytes(range(256)) * 8)
    job = write_job(tmp_path, "  onnx: garbage.onnx\n")
    with pytest.raises(InputError) as info:
        resolve_model(load_job(job))
    assert str(info.value).startswith(f"{job}:7: model.onnx: {tmp_path / 'garbage.onnx'}: not a valid ONNX model: ")
    (tmp_path / "text.onnx").write_text("hello")
    with pytest.raises(InputError, match="model.onnx: .*text.onnx: not a valid ONNX model"):
        resolve_model(load_job(write_job(tmp_path, "  onnx: text.onnx\n")))


def test_onnx_file_source(tmp_path):
    onnx.save(dynamic_reshape_model(), tmp_path / "dyn.onnx")
    with pytest.raises(InputError, match=r"job.yaml:7: model.onnx: .*symbolic dimension 'seq'.*input_shape"):
        resolve_model(load_job(write_job(tmp_path, "  onnx: dyn.onnx\n")))
    job = write_job(tmp_path, "  onnx: dyn.onnx\n  batch_size: 8\n  input_shape: [12, 16]\n", task="training")
    source = resolve_model(load_job(job))
    assert (source.name, source.zoo, source.input_shapes) == ("dyn", None, {"x": [12, 16]})
    assert source.onnx_path == tmp_path / "dyn.onnx"
    _, p = load_analysis(load_job(job))
    assert (p.batch_size, p.task, p.model_name) == (8, Task.training, "dyn")
    assert p.ops[0].macs == 8 * 12 * 32 * 16

    bad_name = write_job(tmp_path, "  onnx: dyn.onnx\n  input_shape:\n    X: [12, 16]\n")
    with pytest.raises(InputError, match=r"job.yaml:9: model.input_shape.X: the model has no input 'X'; did you mean"):
        resolve_model(load_job(bad_name))
    bad_rank = write_job(tmp_path, "  onnx: dyn.onnx\n  input_shape: [12]\n")
    with pytest.raises(InputError, match=r"model.input_shape: .*needs 2 values"):
        resolve_model(load_job(bad_rank))

    onnx.save(tiny_model_fixed_batch(), tmp_path / "fixed.onnx")
    with pytest.raises(InputError, match="model.batch_size: input 'x' has a fixed batch size of 1"):
        resolve_model(load_job(write_job(tmp_path, "  onnx: fixed.onnx\n  batch_size: 4\n")))
    assert resolve_model(load_job(write_job(tmp_path, "  onnx: fixed.onnx\n"))).input_shapes == {"x": [3, 8, 8]}


def tiny_model_fixed_batch() -> onnx.ModelProto:
    model = tiny_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    return model


def test_zoo_source(tmp_path):
    with pytest.raises(InputError, match=r"job.yaml:7: model.zoo: unknown zoo model 'resnet5'; did you mean"):
        resolve_model(load_job(write_job(tmp_path, "  zoo: resnet5\n")))
    with pytest.raises(InputError, match=r"model.input_shape: zoo model 'dlrm_small' has inputs dense, sparse"):
        resolve_model(load_job(write_job(tmp_path, "  zoo: dlrm_small\n  input_shape: [13]\n")))
    with pytest.raises(InputError, match=r"job.yaml:10: model.input_shape.sparse: .*per-sample shape of 1"):
        resolve_model(load_job(write_job(tmp_path, "  zoo: dlrm_small\n  input_shape:\n    dense: [13]\n"
                                                   "    sparse: [26, 2]\n")))
    source = resolve_model(load_job(write_job(tmp_path, "  zoo: mnist_cnn\n  input_shape: [1, 32, 32]\n")))
    assert (source.zoo, source.input_shapes) == ("mnist_cnn", {"input": [1, 32, 32]})
    _, p = load_analysis(load_job(write_job(tmp_path, "  zoo: bert_base\n  batch_size: 2\n")))
    assert p.input_shapes == {"input_ids": (128,)} and p.batch_size == 2


@pytest.mark.slow
def test_a_repeated_analysis_comes_from_the_cache_without_onnx_and_a_changed_file_is_analyzed_again(tmp_path):
    import subprocess
    import sys

    from tests.support.onnx_graphs import write_onnx

    write_onnx(tmp_path / "model.onnx", external=True)
    (tmp_path / "target.yaml").write_text("apiVersion: modak/v1\nkind: Target\nname: t\n"
                                          "cpu: {microarchitecture: zen3, sockets: 1, cores_per_socket: 2}\n"
                                          "memory: {size_gb: 8}\n")
    (tmp_path / "job.yaml").write_text("apiVersion: modak/v1\nkind: Job\nname: j\ntarget: target.yaml\n"
                                       "task: inference\n"
                                       "model: {onnx: model.onnx, batch_size: 4}\n")
    script = ("import sys; from modak.spec.loader import load_job; from modak.workload.source import load_analysis; "
              f"s, p = load_analysis(load_job({str(tmp_path / 'job.yaml')!r})); "
              "print(p.flops, s.data_files, 'onnx' in sys.modules)")
    env = {**__import__("os").environ, "MODAK_CACHE": str(tmp_path / "cache")}

    def run() -> str:
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                              check=True).stdout.split()

    first, second = run(), run()
    assert first[-1] == "True" and second[-1] == "False"  # the second plan never imported onnx
    assert first[:-1] == second[:-1]
    # Another model at the same path (other weights shape: other FLOPs) is analyzed afresh.
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "wider",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                              [numpy_helper.from_array(np.ones((4, 8), np.float32), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save_model(model, tmp_path / "model.onnx")
    third = run()
    assert third[-1] == "True" and int(third[0]) != int(first[0])
    # A cached analysis whose external data file went missing is not trusted: the full check reports it.
    write_onnx(tmp_path / "model.onnx", external=True)
    assert run()[-1] == "True" and run()[-1] == "False"
    (tmp_path / "model.onnx.data").unlink()
    failed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert failed.returncode != 0 and "model.onnx.data" in failed.stderr
