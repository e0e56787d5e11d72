"""Hugging Face architectures as their users write them (#66): built from transformers configs with seeded weights,
called by keyword, returning a ``ModelOutput``, with no wrapper; and a text model served text through the job's
tokenizer (examples/hf-text)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from modak import api
from tests.support.located import assert_located
from tests.support.specs import CPU_TARGET, copied_example

ROOT = Path(__file__).resolve().parent.parent
TEXT_EXAMPLE = ROOT / "examples" / "hf-text"
MODELS = '''
import transformers as t


def llama():
    return t.LlamaForCausalLM(t.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
'''
TOKENS = {"input_ids": [16], "attention_mask": [16]}
TOKEN_TYPES = {"input_dtype": "int64", "input_high": {"input_ids": 1000, "attention_mask": 2}}


def _job(folder: Path, factory: str, model: dict[str, Any], **extra: Any) -> Path:
    (folder / "target.yaml").write_text(CPU_TARGET)
    (folder / "models.py").write_text(MODELS)
    job = {"apiVersion": "modak/v1", "kind": "Job", "name": factory, "target": "target.yaml", "task": "inference",
           "model": {"pytorch": {"module": "models.py", "factory": factory}, **model, "batch_size": 2},
           "precision": ["fp32"], "objective": {"metric": "latency"}, **extra}
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


@pytest.mark.slow
def test_a_decoder_returning_its_cache_plans_on_the_onnx_runtimes_too(tmp_path: Path) -> None:
    """A Llama-style decoder returns logits and a DynamicCache, which no exporter takes: the cache is left out of
    the export, the plan says so, and ONNX Runtime and OpenVINO stay candidates."""
    plan = api.plan_job(_job(tmp_path, "llama", {"input_shape": TOKENS, **TOKEN_TYPES}),
                        predictor_name="roofline").to_dict()
    source = plan["model_source"]
    assert source["call"] == "keyword" and source["outputs"] == ["logits"], source
    assert [d.split()[1] for d in source["dropped_outputs"]] == ["(DynamicCache)"], source
    assert {"onnxruntime", "openvino"} <= {c["runtime"] for c in plan["candidates"]}


def _text_job(tmp_path: Path) -> Path:
    return copied_example(tmp_path, "hf-text")


def eager_logits(job: Path, texts: list[str]) -> np.ndarray:
    """The example's classifier in eager PyTorch on ``texts`` through transformers' own tokenizer (the weights
    as the plan's child and the image make them: seeded before the factory)."""
    import runpy

    import torch
    from transformers import AutoTokenizer

    from modak.image.zoo import SEED

    spec = yaml.safe_load(job.read_text())["model"]
    torch.manual_seed(SEED)
    model = runpy.run_path(str(job.parent / "model.py"))["build_model"]().eval()
    tokens = AutoTokenizer.from_pretrained(job.parent / "tokenizer")(
        texts, padding="max_length", truncation=True, max_length=spec["tokenizer"]["max_length"], return_tensors="pt")
    with torch.no_grad():
        return model(**tokens).logits.numpy()


@pytest.mark.slow
def test_a_text_request_is_served_through_the_jobs_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's plan, rendered and opened as the image opens it: the server takes text (BYTES) and answers
    what eager PyTorch answers on transformers' tokenization; its self-check sends text too."""
    import modak.runtime
    from modak.runtime.serve.smoke import self_check

    job = _text_job(tmp_path)
    plan = api.plan_job(job, predictor_name="roofline")
    assert plan.to_dict()["deployment"]["tokenizer"] == {"folder": "tokenizer", "max_length": 32}
    api.render_plan(plan, tmp_path / "out")
    assert (tmp_path / "out" / "model" / "tokenizer" / "tokenizer.json").is_file()
    # As the image's entrypoint starts it: with its threads set, load() applies no allocation's settings (their
    # OMP_PROC_BIND would pin this test process to one CPU once libgomp starts).
    monkeypatch.setenv("MODAK_THREADS", "1")
    model = modak.runtime.load(tmp_path / "out" / "plan.json", tmp_path / "out" / "model" / "model.onnx")
    texts = ["modak serves text.", "A much longer sentence, " * 10, ""]
    served = model.run(model.encode(texts))["logits"]
    np.testing.assert_allclose(served, eager_logits(job, texts), rtol=1e-4, atol=1e-5)
    result = self_check(model)
    assert result["status"] == "ok" and result["raw_outputs"] == {"logits": [2, 3]}, result


@pytest.mark.parametrize(("change", "field", "message"), [
    (lambda job: job["model"]["tokenizer"].update(max_length=16), "model",
     "input_shape must be [16]: input_ids [32], attention_mask [32], token_type_ids [32]"),
    (lambda job: job["model"]["tokenizer"].update(path="missing"), "model.tokenizer.path", "folder not found"),
    (lambda job: job["model"]["tokenizer"].update(path="."), "model.tokenizer.path", "no tokenizer.json in"),
    (lambda job: job["model"].update(input_shape={"input_ids": [32], "pixel_values": [3, 8, 8]}), "model",
     "a tokenizer fills only input_ids, attention_mask, token_type_ids"),
])
def test_a_bad_tokenizer_section_is_located(tmp_path: Path, change: Any, field: str, message: str) -> None:
    assert_located(_text_job(tmp_path), change, field, message)


def test_text_requests_are_checked(tmp_path: Path) -> None:
    """A text request's BYTES tensor: JSON strings or length-prefixed binary elements; what does not fit is a 400
    naming the input."""
    from modak.image.deployment import Deployment
    from modak.image.runtimes.base import RunRequest
    from modak.image.text import load_text_input
    from modak.runtime import Model, TensorSpec
    from modak.runtime.serve.protocol import RequestError, decode_request
    from modak.runtime.serve.settings import Limits

    shapes = {"input_ids": [32], "attention_mask": [32]}
    deployment = Deployment(runtime="fake", device="cpu", precision="fp32", task="inference", params={}, env={},
                            batch_size=2, input_shapes=shapes)
    request = RunRequest(runtime="fake", device="cpu", precision="fp32", params={}, threads=1, task="inference",
                         onnx_path="", zoo=None, batch_size=2, input_shapes=shapes, workdir="")
    model = Model(deployment, request, None, tuple(TensorSpec(n, (32,), "int64") for n in shapes),  # type: ignore[arg-type]
                  (TensorSpec("logits", (3,), "float32"),), {},
                  preprocessor=load_text_input(TEXT_EXAMPLE / "tokenizer", 32, list(shapes)))
    limits = Limits(max_batch=4, delay_s=0.0, max_queue=8, max_body=1 << 20, max_request_samples=8,
                    max_queued_bytes=1 << 20)

    def decode(tensor: dict[str, Any], binary: bytes = b"") -> Any:
        body = json.dumps({"inputs": [tensor]}).encode()
        return decode_request(body + binary, str(len(body)) if binary else None, model, limits)

    texts = ["one text", "and another"]
    by_json = decode({"name": "text", "datatype": "BYTES", "shape": [2], "data": texts})
    blob = b"".join(len(t.encode()).to_bytes(4, "little") + t.encode() for t in texts)
    by_binary = decode({"name": "text", "datatype": "BYTES", "shape": [2, 1],
                        "parameters": {"binary_data_size": len(blob)}}, blob)
    assert by_json.samples == by_binary.samples == 2 and by_json.preprocess_s is not None
    for name in ("input_ids", "attention_mask"):
        np.testing.assert_array_equal(by_json.feeds[name], by_binary.feeds[name])
    assert by_json.feeds["input_ids"].shape == (2, 32)
    for tensor, message in [
        ({"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}, "it takes BYTES"),
        ({"name": "text", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]}, "shape must be [n] or [n, 1]"),
        ({"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a"]}, "1 items, shape [2] needs 2"),
        ({"name": "text", "datatype": "BYTES", "shape": [1], "data": [3]}, "data must be a list of strings"),
        ({"name": "text", "datatype": "BYTES", "shape": [9], "data": ["a"] * 9}, "at most 8 per request"),
    ]:
        with pytest.raises(RequestError) as info:
            decode(tensor)
        assert message in info.value.message, info.value.message
    blob = len(b"\xff").to_bytes(4, "little") + b"\xff"
    with pytest.raises(RequestError, match="input text: item 0 is not UTF-8 text"):
        decode({"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 5}}, blob)
