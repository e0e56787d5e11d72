"""A served model's pre- and post-processing (#66 item 3): a Hugging Face image processor (examples/hf-vision) and
the user's own ``module:function`` steps; what they cost, measured at plan time in a child process and reported in
the plan; requests of raw items through them; and their mistakes located in the job or the user's file."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from modak import api
from modak.errors import InputError
from modak.spec.loader import load_job
from tests.support.located import assert_located
from tests.support.specs import CPU_TARGET, MIXER_MODULE, copied_example

ROOT = Path(__file__).resolve().parent.parent
VISION_EXAMPLE = ROOT / "examples" / "hf-vision"
# transformers' Pillow processors, the configuration each is checked at, and what its images become
PROCESSORS = [
    ("ViTImageProcessorPil", {}),
    ("ViTImageProcessorPil", {"do_center_crop": True, "crop_size": {"height": 200, "width": 180}}),
    ("ConvNextImageProcessorPil", {}),  # 384: warped to a square
    ("ConvNextImageProcessorPil", {"size": {"shortest_edge": 224}}),  # resized to 224 / crop_pct, then cropped
    ("DeiTImageProcessorPil", {}),
    ("BeitImageProcessorPil", {"do_center_crop": True, "crop_size": {"height": 200, "width": 180}}),
    ("MobileViTImageProcessorPil", {}),  # no normalization, BGR
    ("SegformerImageProcessorPil", {}),
    ("CLIPImageProcessorPil", {}),
    ("BitImageProcessorPil", {"crop_size": {"height": 96, "width": 320}}),  # a crop wider than the resized image
]
# Images of every shape that matters to a resize and crop: landscape, portrait, grey, small, odd
IMAGES = [((480, 640), "RGB"), ((300, 200), "RGB"), ((100, 90), "L"), ((224, 224), "RGB"), ((257, 511), "RGB")]
PRE_MODULE = '''
import numpy as np


def parse(items):
    rows = [np.array([float(v) for v in item.decode().split(",")], np.float32) for item in items]
    return {"x": np.stack(rows).reshape(len(items), 3, 4, 4)}


def broken(items):
    return {"x": np.zeros((len(items), 5), np.float32)}


def raising(items):
    raise ValueError("no comma in " + repr(items[0][:10]))
'''
POST_MODULE = '''
import numpy as np


def best(outputs):
    scores = outputs["output"]
    return {"class": scores.argmax(axis=-1).astype(np.int64), "name": np.array([f"class {i}" for i in
                                                                                 scores.argmax(axis=-1)])}
'''


def _encoded(size: tuple[int, int], mode: str, seed: int) -> tuple[bytes, Any]:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB").convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue(), image


@pytest.mark.parametrize(("processor", "config"), PROCESSORS)
def test_image_steps_equal_transformers_processors(processor: str, config: dict[str, Any], tmp_path: Path) -> None:
    """modak's image steps (Pillow and NumPy, no transformers in the image) make exactly the pixel_values of
    transformers' own Pillow processor, saved as save_pretrained saves it, for images of every orientation."""
    import transformers

    from modak.image.vision import ImageInput, read_steps

    reference = getattr(transformers, processor)(**config)
    reference.save_pretrained(tmp_path)
    encoded = [_encoded(size, mode, seed) for seed, (size, mode) in enumerate(IMAGES)]
    steps = read_steps(tmp_path)
    ours = ImageInput(steps).encode([data for data, _ in encoded], {})["pixel_values"]
    theirs = reference([image.convert("RGB") for _, image in encoded], return_tensors="np")["pixel_values"]
    assert ours.dtype == np.float32 and ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert list(ours.shape[1:]) == steps.output_shape
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


def test_an_image_item_is_raw_bytes_or_base64_and_a_bad_one_is_named(tmp_path: Path) -> None:
    from modak.image.vision import ImageInput, read_steps

    steps = read_steps(VISION_EXAMPLE / "processor")
    data, _ = _encoded((30, 50), "RGB", 0)
    raw = ImageInput(steps).encode([data], {})["pixel_values"]
    np.testing.assert_array_equal(raw, ImageInput(steps).encode([base64.b64encode(data).decode()], {})["pixel_values"])
    for item, message in ((b"not an image", "item 1 is not an image"), ("%%%", "item 1 is not an image: not base64")):
        with pytest.raises(ValueError, match=message):
            ImageInput(steps).encode([data, item], {})


def _vision_job(tmp_path: Path) -> Path:
    return copied_example(tmp_path, "hf-vision")


@pytest.mark.parametrize(("change", "field", "message"), [
    (lambda job: job["model"]["image_processor"].update(path="missing"), "model.image_processor.path",
     "folder not found"),
    (lambda job: job["model"]["image_processor"].update(path="."), "model.image_processor.path",
     "no preprocessor_config.json in"),
    (lambda job: job["model"].update(input_shape={"pixel_values": [3, 32, 32]}), "model.input_shape",
     "the image processor makes pixel_values of [3, 64, 64], the input_shape says [3, 32, 32]"),
    (lambda job: job["model"].update(input_shape={"pixel_values": [3, 64, 64], "mask": [64]}), "model",
     "an image processor fills pixel_values only"),
    (lambda job: job["model"].update(tokenizer={"path": "processor", "max_length": 8}), "model",
     "give one pre-processing: tokenizer or image_processor"),
    (lambda job: job["model"].pop("image_processor"), "model", "postprocess answers requests of raw items"),
    (lambda job: job["model"].update(postprocess="labels.py:top label"), "model.postprocess",
     "expected module:function"),
    (lambda job: job["model"].update(postprocess="missing.py:top_label"), "model.postprocess", "file not found"),
])
def test_a_bad_processing_section_is_located(tmp_path: Path, change: Any, field: str, message: str) -> None:
    assert_located(_vision_job(tmp_path), change, field, message)


def test_an_image_processor_modak_does_not_run_is_refused_when_the_job_loads(tmp_path: Path) -> None:
    path = _vision_job(tmp_path)
    config = path.parent / "processor" / "preprocessor_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "image_processor_type": "DetrImageProcessor"}))
    with pytest.raises(InputError, match="image_processor_type DetrImageProcessor is not one modak runs"):
        load_job(path)
    config.write_text(json.dumps({**json.loads(config.read_text()), "image_processor_type": "ViTImageProcessor",
                                  "do_pad": True}))
    with pytest.raises(InputError, match="asks for steps modak does not run: do_pad"):
        load_job(path)


def eager_labels(job: Path, images: list[Any]) -> tuple[list[str], np.ndarray]:
    """The example's labels and their probabilities in eager PyTorch on transformers' own processing of ``images``
    (the weights as the plan's child and the image make them: seeded before the factory)."""
    import torch
    import transformers

    from modak.image.zoo import SEED

    found = importlib.util.spec_from_file_location("hf_vision_model", job.parent / "model.py")
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)  # the example's own file, whatever other tests imported as "model"
    torch.manual_seed(SEED)
    eager = module.build_model().eval()
    pixels = transformers.ViTImageProcessorPil.from_pretrained(job.parent / "processor")(
        [image.convert("RGB") for image in images], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        probabilities = torch.softmax(eager(pixel_values=pixels).logits, -1).numpy()
    return [module.LABELS[i] for i in probabilities.argmax(-1)], probabilities.max(-1)


@pytest.mark.slow
def test_an_image_request_is_served_through_the_jobs_processor_and_labels(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/hf-vision planned (its processing measured and reported), rendered and opened as the image opens
    it: an encoded image is answered the label and probability that eager PyTorch gives on transformers' own
    processing of the same image; its self-check sends images too."""
    import modak.runtime
    from modak.runtime.serve.smoke import self_check

    job = _vision_job(tmp_path)
    plan = api.plan_job(job, predictor_name="roofline")
    document = plan.to_dict()
    assert document["deployment"]["image_processor"] == {"folder": "processor"}
    assert document["deployment"]["postprocess"] == "labels.py:top_label"
    cost = document["processing"]
    assert cost["kind"] == "image_processor" and cost["items"] == 2 and cost["preprocess_seconds"] > 0 \
        and cost["postprocess_seconds"] > 0, cost
    assert any(reason.startswith("pre-processing (image processor)") for reason in document["reasons"])
    assert api.plan_job(job, predictor_name="roofline").to_dict() == document  # the cached figures: the same plan
    api.render_plan(plan, tmp_path / "out")
    model_folder = tmp_path / "out" / "model"
    assert (model_folder / "processor" / "preprocessor_config.json").is_file()
    assert (model_folder / "labels.py").is_file()
    monkeypatch.setenv("MODAK_THREADS", "1")  # as the entrypoint starts it (no allocation's pinning here)
    model = modak.runtime.load(tmp_path / "out" / "plan.json", model_folder / "model.onnx")
    images = [_encoded(size, mode, seed) for seed, (size, mode) in enumerate(IMAGES[:3])]
    answer = model.postprocess(model.run(model.encode([data for data, _ in images])), len(images))
    labels, probabilities = eager_labels(job, [image for _, image in images])
    assert list(answer["label"]) == labels
    np.testing.assert_allclose(answer["probability"], probabilities, rtol=1e-4)
    result = self_check(model)
    assert result["status"] == "ok" and result["raw_outputs"] == {"label": [2], "probability": [2]}, result


def _function_job(tmp_path: Path, preprocess: str = "pre.py:parse") -> Path:
    (tmp_path / "target.yaml").write_text(CPU_TARGET)
    (tmp_path / "model.py").write_text(MIXER_MODULE)
    (tmp_path / "pre.py").write_text(PRE_MODULE)
    (tmp_path / "post.py").write_text(POST_MODULE)
    (tmp_path / "item.csv").write_text(",".join(str(i / 10) for i in range(48)))
    job = {"apiVersion": "modak/v1", "kind": "Job", "name": "functions", "target": "target.yaml",
           "task": "inference", "model": {"pytorch": {"module": "model.py", "factory": "build_model"},
                                          "input_shape": {"x": [3, 4, 4]}, "batch_size": 3,
                                          "preprocess": {"function": preprocess, "example": "item.csv"},
                                          "postprocess": "post.py:best"},
           "precision": ["fp32"], "objective": {"metric": "latency"}, "constraints": {"runtimes": ["onnxruntime"]}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


@pytest.mark.slow
def test_the_users_functions_are_measured_served_and_answer_strings(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """model.preprocess and model.postprocess as the user's module:function: measured at plan time, carried beside
    the model, and a request of raw items (binary BYTES) is answered the post-processing's numbers and strings."""
    import modak.runtime
    from modak.runtime.serve.smoke import self_check

    plan = api.plan_job(_function_job(tmp_path), predictor_name="roofline")
    document = plan.to_dict()
    assert document["deployment"]["preprocess"] == {"function": "pre.py:parse", "example": "item.csv"}
    assert document["processing"]["kind"] == "function" and document["processing"]["items"] == 3
    api.render_plan(plan, tmp_path / "out")
    monkeypatch.setenv("MODAK_THREADS", "1")
    model = modak.runtime.load(tmp_path / "out" / "plan.json", tmp_path / "out" / "model" / "model.onnx")
    items = [(tmp_path / "item.csv").read_bytes(), b",".join(b"1" for _ in range(48))]
    raw = model.run(model.encode(items))["output"]
    answer = model.postprocess(model.run(model.encode(items)), 2)
    np.testing.assert_array_equal(answer["class"], raw.argmax(-1))
    assert list(answer["name"]) == [f"class {i}" for i in raw.argmax(-1)]
    result = self_check(model)
    assert result["status"] == "ok" and result["raw_outputs"] == {"class": [2], "name": [2]}, result


@pytest.mark.parametrize(("function", "message"), [
    ("pre.py:broken", "it made x [3, 5] of 3 items; the model takes x [3, 3, 4, 4]"),
    ("pre.py:raising", "pre.py:15: ValueError: no comma in"),
    ("pre.py:missing", "pre.py has no function missing"),
])
def test_a_failing_function_is_an_input_error_at_its_field_and_line(tmp_path: Path, function: str,
                                                                    message: str) -> None:
    """The plan runs the user's pre-processing in a child process: what it gets wrong is exit 2, at
    model.preprocess.function, with the user's file and line; nothing of it runs in the planner."""
    job = _function_job(tmp_path, function)
    done = subprocess.run([sys.executable, "-m", "modak", "plan", str(job)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 2, done.stderr
    assert "model.preprocess.function" in done.stderr and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
