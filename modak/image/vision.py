"""Images in, ``pixel_values`` out: the job's Hugging Face image processor (``model.image_processor``) as the image
runs it.

The folder is what ``save_pretrained`` writes; only its ``preprocessor_config.json`` is read. The steps are those
of ``transformers``' Pillow image processors, in their order: convert to RGB, resize (Pillow, the config's
``resample``), center-crop (padding with zeros where the image is smaller), rescale, normalize, flip the channel
order (MobileViT), then channels first. They are done here with Pillow and NumPy, not by ``transformers``, which
would add about 130 MB to every image; ``tests/test_processing.py`` checks them against ``transformers``' own
processors. A processor type or a step outside :data:`PROCESSOR_TYPES` is refused when the job is loaded: such a
model is served through the user's own function (``model.preprocess``).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROCESSOR_FILE = "preprocessor_config.json"
IMAGE_INPUT = "image"  # the served BYTES input: encoded images (PNG, JPEG...), base64 in a JSON request
PIXEL_VALUES = "pixel_values"  # the model's input the processor fills
# The image processor types whose steps are these (transformers' names; ResNet and Swin use ConvNext's and ViT's).
PROCESSOR_TYPES = ("BeitImageProcessor", "BitImageProcessor", "CLIPImageProcessor", "ConvNextImageProcessor",
                   "DeiTImageProcessor", "MobileViTImageProcessor", "SegformerImageProcessor", "ViTImageProcessor")
# Steps of those processors that only concern segmentation labels, or that say what is done anyway.
_IGNORED = ("do_reduce_labels", "do_convert_rgb", "image_processor_type", "processor_class", "feature_extractor_type",
            "image_seq_length", "input_data_format", "data_format", "return_tensors", "default_to_square")
_STEPS = ("do_resize", "size", "resample", "crop_pct", "do_center_crop", "crop_size", "do_rescale", "rescale_factor",
          "do_normalize", "image_mean", "image_std", "do_flip_channel_order")
_DECODED_PIXELS = 1 << 26  # the largest image a request may carry, in pixels (Pillow's bomb check is twice this)


@dataclass(frozen=True)
class ImageSteps:
    """What an image processor does to one image: the steps of ``preprocessor_config.json``."""

    resize: tuple[int, int] | int | None  # (height, width), the shortest edge, or None
    resample: int  # Pillow's filter number
    crop: tuple[int, int] | None  # (height, width) of the center crop
    rescale: float | None
    mean: tuple[float, ...] | None  # normalize with mean and std, or None
    std: tuple[float, ...] | None
    flip: bool  # RGB -> BGR last

    @property
    def output_shape(self) -> list[int] | None:
        """[3, height, width] of every image it makes, or None where that depends on the image."""
        size = self.crop or (self.resize if isinstance(self.resize, tuple) else None)
        return [3, *size] if size is not None else None


@dataclass(frozen=True)
class ImageInput:
    """A loaded image processor that fills the model's ``pixel_values``."""

    steps: ImageSteps
    input_name: str = IMAGE_INPUT

    def encode(self, items: Sequence[bytes | str], dtypes: Mapping[str, Any]) -> dict[str, Any]:
        """``pixel_values`` of the encoded images ``items`` (raw bytes, or base64 text from a JSON request);
        ValueError names the item that is not an image."""
        import numpy as np

        pixels = [_process(self.steps, _decode(item, index)) for index, item in enumerate(items)]
        return {PIXEL_VALUES: np.stack(pixels).astype(dtypes.get(PIXEL_VALUES, "float32"), copy=False)}


def read_steps(folder: Path) -> ImageSteps:
    """The steps of the image processor saved in ``folder``; ValueError says what is not supported."""
    try:
        config = json.loads((folder / PROCESSOR_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {folder / PROCESSOR_FILE}: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{folder / PROCESSOR_FILE} is not a JSON object")
    kind = str(config.get("image_processor_type", "")).removesuffix("Fast").removesuffix("Pil")
    if kind not in PROCESSOR_TYPES:
        raise ValueError(f"image_processor_type {kind or 'not given'} is not one modak runs "
                         f"({', '.join(PROCESSOR_TYPES)}); serve the model through your own function "
                         "(model.preprocess)")
    unknown = sorted(k for k, v in config.items() if k not in (*_STEPS, *_IGNORED) and not k.startswith("_")
                     and v not in (False, None))
    if unknown:
        raise ValueError(f"{PROCESSOR_FILE} asks for steps modak does not run: {', '.join(unknown)}")
    mobilevit = kind == "MobileViTImageProcessor"
    resize, crop = _resize(config, kind) if config.get("do_resize", True) else (None, None)
    if config.get("do_center_crop") and kind != "SegformerImageProcessor":  # (Segformer's has no crop step)
        crop = _size(config.get("crop_size"), "crop_size")
    normalize = config.get("do_normalize", not mobilevit)
    return ImageSteps(resize=resize, resample=int(config.get("resample", 2)), crop=crop,
                      rescale=float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else None,
                      mean=tuple(map(float, _channels(config, "image_mean"))) if normalize else None,
                      std=tuple(map(float, _channels(config, "image_std"))) if normalize else None,
                      flip=bool(config.get("do_flip_channel_order", mobilevit)))


def _channels(config: Mapping[str, Any], key: str) -> list[float]:
    value = config.get(key, [0.5, 0.5, 0.5])
    values = value if isinstance(value, list) else [value] * 3
    if len(values) != 3 or not all(isinstance(v, (int, float)) for v in values):
        raise ValueError(f"{key} must be three numbers (one per RGB channel), got {value!r}")
    return values


def _size(value: object, key: str) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, dict) and set(value) == {"height", "width"} and all(
            isinstance(v, int) and v > 0 for v in value.values()):
        return (value["height"], value["width"])
    raise ValueError(f"{key} must be {{height, width}}, got {value!r}")


def _resize(config: Mapping[str, Any], kind: str) -> tuple[tuple[int, int] | int, tuple[int, int] | None]:
    """The resize ((height, width), or the shortest edge) and the crop it implies: ConvNext below 384 pixels
    resizes the shortest edge to edge / crop_pct, then crops edge x edge."""
    size = config.get("size", {"height": 224, "width": 224})
    if not (isinstance(size, dict) and set(size) == {"shortest_edge"} and isinstance(size["shortest_edge"], int)
            and size["shortest_edge"] > 0):
        return _size(size, "size"), None
    edge = size["shortest_edge"]
    if kind != "ConvNextImageProcessor":
        return edge, None
    if edge >= 384:  # warped to a square, not cropped
        return (edge, edge), None
    return int(edge / float(config.get("crop_pct", 224 / 256))), (edge, edge)


def _decode(item: bytes | str, index: int) -> Any:
    """The RGB Pillow image of one request item (alpha composited on white, as transformers converts)."""
    from PIL import Image

    try:
        data = base64.b64decode(item, validate=True) if isinstance(item, str) else item
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > _DECODED_PIXELS:
            raise ValueError(f"{image.width}x{image.height} pixels; at most {_DECODED_PIXELS} are taken")
        image.load()
    except (binascii.Error, OSError, ValueError, Image.DecompressionBombError) as exc:
        what = "not base64" if isinstance(exc, binascii.Error) else str(exc)
        raise ValueError(f"item {index} is not an image: {what}") from None
    if image.mode == "RGBA":
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image).convert("RGB")
    return image.convert("RGB")


def _process(steps: ImageSteps, image: Any) -> Any:
    """One image through ``steps``: float32 [3, height, width]."""
    import numpy as np

    if steps.resize is not None:
        if isinstance(steps.resize, tuple):
            height, width = steps.resize
        else:
            height, width = _shortest_edge(image.height, image.width, steps.resize)
        image = image.resize((width, height), resample=steps.resample)
    pixels = np.asarray(image).transpose(2, 0, 1)
    if steps.crop is not None:
        pixels = _center_crop(pixels, *steps.crop)
    values = pixels.astype(np.float64) * steps.rescale if steps.rescale is not None else pixels
    values = values.astype(np.float32)
    if steps.mean is not None and steps.std is not None:
        values = (values - np.array(steps.mean, np.float32)[:, None, None]) / np.array(steps.std, np.float32)[
            :, None, None]
    return values[::-1].copy() if steps.flip else values


def _shortest_edge(height: int, width: int, edge: int) -> tuple[int, int]:
    """(height, width) with the shorter side ``edge`` and the ratio kept (the longer side rounded down)."""
    short, long = sorted((height, width))
    new_long = int(edge * long / short)
    return (new_long, edge) if width <= height else (edge, new_long)


def _center_crop(pixels: Any, height: int, width: int) -> Any:
    """The center ``height`` x ``width`` of [C, H, W] ``pixels``, padded with zeros where they are smaller."""
    import numpy as np

    _, rows, cols = pixels.shape
    top, left = (rows - height) // 2, (cols - width) // 2
    if top >= 0 and left >= 0:
        return pixels[:, top:top + height, left:left + width]
    padded = np.zeros((pixels.shape[0], max(rows, height), max(cols, width)), pixels.dtype)
    pad_top, pad_left = math.ceil((padded.shape[1] - rows) / 2), math.ceil((padded.shape[2] - cols) / 2)
    padded[:, pad_top:pad_top + rows, pad_left:pad_left + cols] = pixels
    top, left = (padded.shape[1] - height) // 2, (padded.shape[2] - width) // 2
    return padded[:, top:top + height, left:left + width]
