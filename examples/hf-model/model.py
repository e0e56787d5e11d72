"""A Hugging Face model as a modak job's own PyTorch module (docs/tutorials/own-model.md): the factory loads it
from a local folder (``save_pretrained``, or a snapshot of the Hub), so that modak's child process needs no network.
``torchscript=True`` makes the model return tuples, which the ONNX exporters take."""

from transformers import AutoModelForSequenceClassification


def build_model(path: str):
    return AutoModelForSequenceClassification.from_pretrained(path, torchscript=True).eval()
