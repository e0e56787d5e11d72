"""The model zoo: registry, inputs, cached ONNX export, and ONNX Runtime agreeing with PyTorch."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from modak.errors import InputError
from modak.image import zoo as entries
from modak.workload import zoo

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")


def test_import_needs_no_torch():
    code = "import sys, modak.image.zoo, modak.workload.zoo, modak.workload.source; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registry():
    assert entries.zoo_names() == sorted(["mnist_cnn", "resnet18", "resnet34", "resnet50", "mobilenet_v2", "bert_base",
                                          "bert_small", "vit_tiny", "yolo_small", "dlrm_small", "ncf", "mlp",
                                          "mlp_large", "convnext_atto", "unet_small", "lstm_lm", "efficientnet_b0",
                                          "squeezenet", "gru_kws", "gpt_small", "m5_audio", "chain4", "chain64",
                                          "detr_r18", "mobilevit_xxs", "deepspeech_small", "crnn_sed"])
    for name in entries.zoo_names():
        entry = entries.get_entry(name)
        assert entry.name == name and entry.description and entry.tasks
        assert set(entry.input_shapes) == set(entry.input_dtypes)


def test_the_catalog_and_the_factory_registry_agree():
    from modak.image import zoo_models

    assert {entry.factory for entry in entries.ZOO.values()} == set(zoo_models.FACTORIES)
    assert all(function.__name__ == name for name, function in zoo_models.FACTORIES.items())
    with pytest.raises(ValueError, match="two zoo factories are named mlp"):
        zoo_models.factory(zoo_models.FACTORIES["mlp"])


def test_unknown_name_suggests_close_match():
    with pytest.raises(InputError, match="unknown zoo model 'resnet_50'; did you mean 'resnet50'"):
        entries.get_entry("resnet_50")
    with pytest.raises(InputError, match="known: .*bert_base"):
        entries.get_entry("transformer-xl")


def test_shape_overrides_are_checked():
    entry = entries.get_entry("resnet50")
    assert entry.shapes({"input": [3, 160, 160]}) == {"input": (3, 160, 160)}
    with pytest.raises(InputError, match="per-sample shape of 3"):
        entry.shapes({"input": [3, 224]})
    with pytest.raises(InputError, match="no input 'image'"):
        entry.shapes({"image": [3, 224, 224]})
    with pytest.raises(InputError, match="multiples of 32"):
        entries.get_entry("yolo_small").build({"input": [3, 300, 300]})
    with pytest.raises(InputError, match="convnext_atto.*multiples of 32"):
        entries.get_entry("convnext_atto").build({"input": [3, 200, 200]})
    with pytest.raises(InputError, match="unet_small.*multiples of 16"):
        entries.get_entry("unet_small").build({"input": [1, 100, 100]})


def test_make_inputs():
    ids = entries.make_inputs("bert_base", 4)["input_ids"]
    assert ids.shape == (4, 128) and ids.dtype == torch.int64
    assert 0 <= int(ids.min()) and int(ids.max()) < 30522
    inputs = entries.make_inputs("dlrm_small", 2)
    assert list(inputs) == ["dense", "sparse"]
    assert inputs["dense"].shape == (2, 13) and inputs["sparse"].shape == (2, 26)
    assert int(inputs["sparse"].max()) < 10_000
    assert torch.equal(entries.make_inputs("mlp", 2)["input"], entries.make_inputs("mlp", 2)["input"])


def test_export_is_cached_per_shape():
    path = zoo.export_onnx("mlp")
    assert zoo.export_onnx("mlp") == path
    other = zoo.export_onnx("mlp", {"input": [512]})
    assert other != path and other.is_file()
    assert not [p for p in path.parent.parent.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_a_changed_architecture_is_another_export(tmp_path, monkeypatch):
    """The export cache is keyed by the zoo's code, not a version someone has to remember to bump."""
    before = zoo.export_path("mlp")
    for name in ("zoo.py", "zoo_models.py"):
        (tmp_path / name).write_bytes(Path(entries.__file__).with_name(name).read_bytes())
    monkeypatch.setattr(entries, "__file__", str(tmp_path / "zoo.py"))
    assert zoo.export_path("mlp") == before  # the same code
    with (tmp_path / "zoo_models.py").open("a") as models:
        models.write("# an architecture changed\n")
    assert zoo.export_path("mlp") != before


@pytest.mark.slow
@pytest.mark.parametrize("name", entries.zoo_names())
def test_export_runs_in_onnxruntime_like_pytorch(name):
    path = zoo.export_onnx(name)
    model = onnx.load(path, load_external_data=False)
    assert model.ir_version == zoo.IR_VERSION
    assert {o.domain: o.version for o in model.opset_import}[""] == zoo.OPSET
    for value in (*model.graph.input, *model.graph.output):
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch"

    inputs = entries.make_inputs(name, 3)  # not the traced batch of 2: the batch dimension is dynamic
    with torch.no_grad():
        expected = entries.get_entry(name).build()(*inputs.values()).numpy()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {key: value.numpy() for key, value in inputs.items()})
    assert actual.shape == expected.shape and expected.shape[0] == 3
    scale = float(np.abs(expected).max())
    assert scale > 0
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-4 * scale)
