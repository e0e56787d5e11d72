"""The shapes ONNX shape inference leaves unknown (modak.workload.shapes): real architectures whose exports it cannot
resolve, planned all the same, and hand-built graphs that only a run resolves or that nothing does."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modak.api import load as load_job
from modak.documents import encoded
from modak.errors import InputError
from modak.plan import make_plan
from modak.predict.roofline import RooflinePredictor
from modak.workload import shapes
from modak.workload.analysis import analyze
from modak.workload.source import load_analysis
from tests.test_ci_step import assert_valid

TARGET = """apiVersion: modak/v1
kind: Target
name: box
cpu: {microarchitecture: zen4, cores_per_socket: 8}
memory: {size_gb: 64}
"""


def export(model, keyword: str, example, path: Path) -> Path:
    """``model`` (a transformers model called with ``keyword=`` its input) exported to ONNX at ``path``, its
    ``last_hidden_state`` the output. The TorchScript exporter, the user model's second exporter
    (modak.workload.usercode_child): torch 2.13's dynamo exporter cannot decompose transformers 5's attention
    views of these models."""
    import torch

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model.eval()

        def forward(self, x):
            return self.model(**{keyword: x}).last_hidden_state

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's about Python booleans of shapes, fixed at this export
        torch.onnx.export(LastHiddenState(), (example,), str(path), input_names=["x"], dynamo=False,
                          dynamic_axes={"x": {0: "batch"}}, opset_version=17)
    return path


def swin(folder: Path) -> Path:
    """A small Swin, whose window partition pads its feature map: ONNX cannot infer the Pad's shape."""
    import torch
    from transformers import SwinConfig, SwinModel

    torch.manual_seed(0)
    model = SwinModel(SwinConfig(image_size=64, patch_size=4, embed_dim=24, depths=[1, 1], num_heads=[1, 2],
                                 window_size=4))
    return export(model, "pixel_values", torch.rand(2, 3, 64, 64), folder / "swin.onnx")


def t5_encoder(folder: Path) -> Path:
    """A small T5 encoder, whose relative position bias ranges over the sequence: ONNX cannot infer the Range."""
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    model = T5EncoderModel(T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4))
    return export(model, "input_ids", torch.zeros(2, 16, dtype=torch.long), folder / "t5.onnx")


def swin_macs() -> int:
    """The MACs of :func:`swin` at batch 2, by hand: the patch embedding, then per stage (tokens, width, windows x
    heads, head width) the q, k, v and output projections, QK^T and AV over 16-token windows and the MLP (4x
    wide), and the patch merging (4 x 24 -> 48) between them."""
    def stage(tokens: int, width: int, windows_heads: int, head_width: int) -> int:
        return 4 * tokens * width * width + 2 * windows_heads * 16 * 16 * head_width + 8 * tokens * width * width

    return 2 * 16 * 16 * 24 * 3 * 4 * 4 + stage(2 * 256, 24, 2 * 16 * 1, 24) + 2 * 64 * 96 * 48 \
        + stage(2 * 64, 48, 2 * 4 * 2, 24)


@pytest.mark.slow
def test_a_swin_export_is_analysed_with_the_shapes_of_a_run(tmp_path: Path) -> None:
    profile = analyze(swin(tmp_path), 2)
    sources = profile.shape_sources
    assert sources["run"] > 0 and sources["guessed"] == 0 and profile.unknown_shapes == ()
    assert sum(sources.values()) == len(profile.ops)
    assert encoded(profile.shapes_record()) == {"sources": dict(sources), "unknown": []}
    assert profile.macs == swin_macs() and profile.flops > 2 * profile.macs


@pytest.mark.slow
def test_a_t5_encoder_export_is_analysed_with_symbolic_shapes(tmp_path: Path) -> None:
    profile = analyze(t5_encoder(tmp_path), 2)
    sources = profile.shape_sources
    assert sources["symbolic"] > 0 and sources["run"] == sources["guessed"] == 0 and profile.unknown_shapes == ()
    # q, k, v, o (32 x 32) and the feed-forward (32 -> 64 -> 32) on 2 x 16 tokens; QK^T and AV over 4 heads of 8
    assert profile.macs == 2 * 16 * (4 * 32 * 32 + 2 * 32 * 64) + 2 * 2 * 4 * 16 * 16 * 8
    assert profile.flops > 2 * profile.macs


@pytest.mark.slow
def test_a_swin_onnx_file_plans_and_the_plan_says_where_its_shapes_came_from(tmp_path: Path) -> None:
    swin(tmp_path)
    (tmp_path / "target.yaml").write_text(TARGET)
    (tmp_path / "job.yaml").write_text("apiVersion: modak/v1\nkind: Job\nname: swin\ntarget: target.yaml\n"
                                       "task: inference\nmodel:\n  onnx: swin.onnx\n  batch_size: 2\n")
    loaded = load_job(tmp_path / "job.yaml")
    plan = make_plan(loaded, *load_analysis(loaded), RooflinePredictor())
    document = plan.to_dict()
    assert_valid("plan.schema.json", document)
    record = document["workload"]["shapes"]
    assert record["sources"]["run"] > 0 and record["unknown"] == []
    assert any("one run of the graph in ONNX Runtime at batch 2" in reason for reason in document["reasons"])


def data_dependent_model() -> onnx.ModelProto:
    """x [batch, 4] -> NonZero -> Transpose -> Cast: the number of nonzero elements is the data's."""
    nodes = [helper.make_node("NonZero", ["x"], ["where"], name="nonzero"),
             helper.make_node("Transpose", ["where"], ["rows"], name="transpose"),
             helper.make_node("Cast", ["rows"], ["y"], name="cast", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_a_shape_of_the_data_comes_from_a_run() -> None:
    profile = analyze(data_dependent_model(), 3)
    assert profile.shape_sources == {"onnx": 0, "symbolic": 0, "run": 3, "guessed": 0}
    cast = profile.ops[-1]  # the run's inputs are random in [0, 1): all 12 elements are nonzero
    assert (cast.input_bytes, cast.output_bytes) == (12 * 2 * 8, 12 * 2 * 4)


@pytest.mark.parametrize("limit, value", [("SHAPE_RUN_SECONDS", 0.01), ("SHAPE_RUN_MEMORY_BYTES", 2**20)])
def test_a_run_beyond_its_limits_is_stopped_and_its_shapes_guessed(monkeypatch: pytest.MonkeyPatch, limit: str,
                                                                   value: float) -> None:
    monkeypatch.setattr(shapes, limit, value)
    profile = analyze(data_dependent_model(), 3)
    assert profile.shape_sources == {"onnx": 0, "symbolic": 0, "run": 0, "guessed": 3}


def custom_op_model() -> onnx.ModelProto:
    """x [batch, 4] -> a custom op no shape inference and no runtime knows -> MatMul with W [4, 8] -> Relu."""
    weight = numpy_helper.from_array(np.ones((4, 8), np.float32), "W")
    nodes = [helper.make_node("Mystery", ["x"], ["m"], name="custom", domain="example.ops"),
             helper.make_node("MatMul", ["m", "W"], ["h"], name="matmul"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.ops", 1)])
    model.ir_version = 10
    return model


def test_a_node_no_source_resolves_is_priced_at_guessed_shapes_and_named() -> None:
    profile = analyze(custom_op_model(), 2)
    assert profile.shape_sources == {"onnx": 0, "symbolic": 0, "run": 0, "guessed": 3}
    assert profile.unknown_shapes == ("custom", "matmul", "relu")
    custom, matmul, relu = profile.ops
    # each unknown tensor as large as the largest of its node already sized: x [2, 4], then W [4, 8]
    assert (custom.flops, custom.input_bytes, custom.output_bytes) == (8, 32, 32)
    assert matmul.weight_bytes == 128 and matmul.output_bytes == 128 and matmul.macs == 32 * 8
    assert relu.flops == 32
    assert encoded(profile.shapes_record()) == {"sources": profile.shape_sources,
                                                "unknown": ["custom", "matmul", "relu"]}


def test_without_onnxruntime_the_shapes_are_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shapes.importlib.util, "find_spec", lambda name: None)  # no onnxruntime
    monkeypatch.setattr(shapes, "_symbolic_inference", lambda: None)
    profile = analyze(data_dependent_model(), 3)
    assert profile.shape_sources == {"onnx": 0, "symbolic": 0, "run": 0, "guessed": 3}
    # NonZero's [2, ?] as large as x [3, 4]: [2, 6] (the run finds [2, 12])
    assert profile.ops[0].output_bytes == 2 * 6 * 8


def test_a_plan_names_the_nodes_priced_at_guessed_shapes(tmp_path: Path) -> None:
    onnx.save(custom_op_model(), tmp_path / "custom.onnx")
    (tmp_path / "target.yaml").write_text(TARGET)
    (tmp_path / "job.yaml").write_text("apiVersion: modak/v1\nkind: Job\nname: custom\ntarget: target.yaml\n"
                                       "task: inference\nmodel:\n  onnx: custom.onnx\n  batch_size: 2\n")
    loaded = load_job(tmp_path / "job.yaml")
    document = make_plan(loaded, *load_analysis(loaded), RooflinePredictor()).to_dict()
    assert_valid("plan.schema.json", document)
    assert document["workload"]["shapes"] == {"sources": {"onnx": 0, "symbolic": 0, "run": 0, "guessed": 3},
                                              "unknown": ["custom", "matmul", "relu"]}
    assert any(reason.startswith("3 node(s) priced at guessed shapes") and reason.endswith("custom, matmul, relu")
               for reason in document["reasons"])
    cached = load_analysis(loaded)[1]  # the analysis again, from its cache
    assert cached.unknown_shapes == ("custom", "matmul", "relu") and cached.shape_sources["guessed"] == 3


def test_a_graph_contradicting_itself_is_still_an_input_error() -> None:
    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"], name="add")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
                               helper.make_tensor_value_info("c", TensorProto.FLOAT, ["batch", 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    with pytest.raises(InputError, match=r"ONNX shape inference failed: .*node name: add.*Incompatible dimensions"):
        analyze(model, 2)
