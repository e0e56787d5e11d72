"""What turns a request's raw items into the model's inputs, and the model's outputs into the answer: one small
interface over the job's tokenizer (:mod:`modak.image.text`), image processor (:mod:`modak.image.vision`) and the
user's own functions (:mod:`modak.image.functions`), loaded from the plan's deployment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from modak.image.deployment import Deployment
from modak.image.functions import FunctionInput, FunctionOutput, user_function
from modak.image.text import TOKEN_FIELDS, load_text_input
from modak.image.vision import ImageInput, read_steps


class Preprocessor(Protocol):
    """Request items (the elements of the served BYTES input ``input_name``) in, the model's inputs out."""

    @property
    def input_name(self) -> str:
        """The served BYTES input it takes."""

    def encode(self, items: Sequence[bytes | str], dtypes: Mapping[str, Any]) -> dict[str, Any]:
        """The model's inputs for ``items``, as arrays of ``dtypes`` (input name -> NumPy dtype); ValueError says
        what does not fit."""


def load_preprocessor(deployment: Deployment, folder: Path, inputs: Sequence[str]) -> Preprocessor | None:
    """The deployment's pre-processing, its files beside the model file in ``folder``; None without one."""
    if deployment.tokenizer is not None:
        return load_text_input(folder / deployment.tokenizer["folder"], int(deployment.tokenizer["max_length"]),
                               [name for name in inputs if name in TOKEN_FIELDS])
    if deployment.image_processor is not None:
        return ImageInput(read_steps(folder / deployment.image_processor["folder"]))
    if deployment.preprocess is not None:
        reference = deployment.preprocess["function"]
        return FunctionInput(user_function(folder, reference), reference)
    return None


def load_postprocessor(deployment: Deployment, folder: Path) -> FunctionOutput | None:
    """The deployment's post-processing (the user's function), or None."""
    if deployment.postprocess is None:
        return None
    return FunctionOutput(user_function(folder, deployment.postprocess), deployment.postprocess)


SAMPLE_TEXTS = ("The smoke test's first sentence.", "A second, longer one: served through the tokenizer.")
SAMPLE_IMAGE_SIZES = ((480, 640), (300, 200))  # (height, width): one landscape, one portrait image


def sample_items(deployment: Deployment, folder: Path) -> list[bytes | str]:
    """Raw items the deployment's pre-processing takes, for the smoke test and the plan's measurement: two texts,
    two PNG images, or the job's example item twice (``folder`` holds it); none without pre-processing."""
    if deployment.tokenizer is not None:
        return list(SAMPLE_TEXTS)
    if deployment.image_processor is not None:
        return [sample_image(height, width) for height, width in SAMPLE_IMAGE_SIZES]
    if deployment.preprocess is not None:
        return [(folder / deployment.preprocess["example"]).read_bytes()] * 2
    return []


def sample_image(height: int, width: int) -> bytes:
    """A deterministic RGB test image (gradients) of ``height`` x ``width`` pixels, PNG-encoded."""
    import io

    import numpy as np
    from PIL import Image

    rows, cols = np.mgrid[0:height, 0:width]
    pixels = np.stack([rows * 255 // max(height - 1, 1), cols * 255 // max(width - 1, 1),
                       (rows + cols) % 256], axis=-1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, "PNG")
    return buffer.getvalue()
