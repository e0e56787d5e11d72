"""The Open Inference Protocol (KServe v2) codec: an infer request's JSON and binary tensors checked against the
model, and its answer encoded (see :mod:`modak.runtime.serve` for what is supported)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from modak.runtime import FeedError, Model
from modak.runtime.serve.settings import Limits

HEADER_LENGTH = "Inference-Header-Content-Length"
# v2 datatype <-> NumPy dtype name (BYTES and BF16 have no NumPy counterpart here).
DATATYPES = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
             "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
             "float32": "FP32", "float64": "FP64"}
DTYPES = {v2: np.dtype(name) for name, v2 in DATATYPES.items()}


class RequestError(Exception):
    """A request refused with ``status`` and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ModelFailure(Exception):
    """The runtime raised while running a batch (a 500)."""


@dataclass
class Decoded:
    """An infer request, checked: the model's inputs as arrays and the outputs to return."""

    feeds: dict[str, np.ndarray]
    samples: int
    outputs: list[tuple[str, bool]] | None  # name, binary; None: all, binary as binary_data_output says
    binary: bool  # binary_data_output
    id: str | None = None
    preprocess_s: float | None = None  # the pre-processing's seconds, for a request of raw items
    raw: bool = False  # raw items through the pre-processing: the answer is the post-processing's (if any)


def decode_request(body: bytes, header_length: str | None, model: Model, limits: Limits) -> Decoded:
    """The checked request in ``body``; :class:`RequestError` (400, 413) says what is wrong."""
    binary = b""
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise RequestError(400, f"{HEADER_LENGTH} {header_length!r} does not fit a body of {len(body)} bytes")
        body, binary = body[:int(header_length)], body[int(header_length):]
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"malformed JSON: {exc}") from None
    if not isinstance(request, dict):
        raise RequestError(400, "the request must be a JSON object")
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError(400, "id must be a string")
    parameters = _object(request.get("parameters"), "parameters")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, dict) for i in inputs):
        raise RequestError(400, "inputs must be a non-empty list of tensors")
    processor = model.preprocessor
    items_sent = processor is not None and any(tensor.get("name") == processor.input_name for tensor in inputs)
    binary_default = bool(parameters.get("binary_data_output"))
    outputs = _requested_outputs(request.get("outputs"), model, binary_default,
                                 items_sent and model.postprocessor is not None)
    if items_sent:
        assert processor is not None
        items = _items(inputs, binary, limits, processor.input_name)
        start = time.perf_counter()
        try:
            feeds = model.encode(items)
        except FeedError as exc:
            raise RequestError(400, f"input {processor.input_name}: {exc}") from None
        return Decoded(feeds, len(items), outputs, binary_default, request_id, time.perf_counter() - start,
                       raw=True)
    specs = {spec.name: spec for spec in model.inputs}
    raw: dict[str, tuple[list[int], str, dict[str, Any]]] = {}
    for tensor in inputs:
        name, shape, datatype = tensor.get("name"), tensor.get("shape"), tensor.get("datatype")
        if not isinstance(name, str) or name not in specs:
            raise RequestError(400, f"unknown input {name!r}; the model's inputs are {', '.join(specs)}")
        if name in raw:
            raise RequestError(400, f"input {name} appears twice")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise RequestError(400, f"input {name}: shape must be a list of non-negative integers")
        want = DATATYPES[specs[name].dtype]
        if datatype != want:
            known = "" if datatype in DTYPES else " (not a v2 datatype this server knows)"
            raise RequestError(400, f"input {name}: datatype {datatype!r}{known}; the model takes {want}")
        if not shape:
            raise RequestError(400, f"input {name}: shape needs a batch dimension")
        if shape[0] > limits.max_request_samples:
            raise RequestError(413, f"input {name}: {shape[0]} samples; this server takes at most "
                                    f"{limits.max_request_samples} per request")
        raw[name] = (shape, datatype, tensor)
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for name, (shape, datatype, tensor) in raw.items():
        size = _object(tensor.get("parameters"), f"input {name} parameters").get("binary_data_size")
        if size is not None:
            need = math.prod(shape) * DTYPES[datatype].itemsize
            if type(size) is not int or size != need or offset + size > len(binary):
                raise RequestError(400, f"input {name}: binary_data_size {size!r}, shape {shape} needs {need} "
                                        f"bytes ({len(binary) - offset} left in the body)")
            arrays[name] = np.frombuffer(binary, DTYPES[datatype].newbyteorder("<"), math.prod(shape),
                                         offset).reshape(shape).astype(DTYPES[datatype])
            offset += size
        elif "data" in tensor:
            arrays[name] = _array(tensor["data"], shape, datatype, name)
        else:
            raise RequestError(400, f"input {name}: no data (neither data nor binary_data_size)")
    if offset != len(binary):
        raise RequestError(400, f"{len(binary) - offset} bytes of binary data left over after the inputs")
    try:
        feeds = model.check(arrays)
    except FeedError as exc:
        raise RequestError(400, str(exc)) from None
    return Decoded(feeds, len(next(iter(feeds.values()))), outputs, binary_default, request_id)


def _items(inputs: list[dict[str, Any]], binary: bytes, limits: Limits, name: str) -> list[bytes | str]:
    """The items of a request of raw items: one BYTES tensor named ``name`` of shape [n] (or [n, 1]), its
    elements JSON strings or binary data (each a 4-byte little-endian length, then the bytes)."""
    if len(inputs) != 1:
        raise RequestError(400, f"a request of raw items has one input, {name}; got {len(inputs)}")
    tensor = inputs[0]
    shape, datatype = tensor.get("shape"), tensor.get("datatype")
    if datatype != "BYTES":
        raise RequestError(400, f"input {name}: datatype {datatype!r}; it takes BYTES")
    if not isinstance(shape, list) or not shape or not all(type(d) is int and d >= 0 for d in shape) \
            or math.prod(shape[1:]) != 1:
        raise RequestError(400, f"input {name}: shape must be [n] or [n, 1] (one item per sample)")
    if shape[0] > limits.max_request_samples:
        raise RequestError(413, f"input {name}: {shape[0]} samples; this server takes at most "
                                f"{limits.max_request_samples} per request")
    size = _object(tensor.get("parameters"), f"input {name} parameters").get("binary_data_size")
    items: list[bytes | str]
    if size is not None:
        if type(size) is not int or size != len(binary):
            raise RequestError(400, f"input {name}: binary_data_size {size!r}, the body has {len(binary)} "
                                    "bytes of binary data")
        items, offset = [], 0
        while offset < len(binary):
            length = int.from_bytes(binary[offset:offset + 4], "little")
            if offset + 4 + length > len(binary):
                raise RequestError(400, f"input {name}: an element's length runs past the binary data")
            items.append(binary[offset + 4:offset + 4 + length])
            offset += 4 + length
    else:
        data = tensor.get("data")
        rows = data if isinstance(data, list) else []
        items = [item for row in rows for item in (row if isinstance(row, list) else [row])]
        if not all(isinstance(item, str) for item in items):
            raise RequestError(400, f"input {name}: data must be a list of strings")
    if len(items) != shape[0]:
        raise RequestError(400, f"input {name}: {len(items)} items, shape {shape} needs {shape[0]}")
    return items


def _object(value: object, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(400, f"{what} must be a JSON object")
    return value


def _array(data: object, shape: list[int], datatype: str, name: str) -> np.ndarray:
    """``data`` (flat or nested JSON numbers) as an array of ``shape`` and ``datatype``, without lossy casts."""
    if not isinstance(data, list):
        raise RequestError(400, f"input {name}: data must be a list")
    try:
        array = np.asarray(data)
    except ValueError:
        raise RequestError(400, f"input {name}: data is nested unevenly") from None
    dtype = DTYPES[datatype]
    if array.size != math.prod(shape):
        raise RequestError(400, f"input {name}: {array.size} values, shape {shape} needs {math.prod(shape)}")
    kinds = "b" if dtype.kind == "b" else "iu" if dtype.kind in "iu" else "iuf"
    expected = {"b": "booleans", "iu": "integers in the range of", "iuf": "numbers"}[kinds]
    if array.size and (array.dtype.kind not in kinds or dtype.kind in "iu" and (
            array.min() < np.iinfo(dtype).min or array.max() > np.iinfo(dtype).max)):
        raise RequestError(400, f"input {name}: data must be {expected} {datatype}")
    return array.reshape(shape).astype(dtype)


def _requested_outputs(outputs: object, model: Model, binary_default: bool, postprocessed: bool
                       ) -> list[tuple[str, bool]] | None:
    """The outputs asked for, each with whether it is sent as binary data; None: all of the post-processing's."""
    names = [spec.name for spec in model.outputs]
    if outputs is None:  # all, in the model's order (the post-processing's are known once it ran)
        return None if postprocessed else [(name, binary_default) for name in names]
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise RequestError(400, "outputs must be a list of objects")
    chosen = []
    for output in outputs:
        name = output.get("name")
        if not isinstance(name, str) or not postprocessed and name not in names:
            raise RequestError(400, f"unknown output {name!r}; the model's outputs are {', '.join(names)}")
        parameters = _object(output.get("parameters"), f"output {name} parameters")
        if parameters.get("classification"):
            raise RequestError(400, "classification outputs are not supported")
        chosen.append((name, bool(parameters.get("binary_data", binary_default))))
    return chosen


def encode_response(model: Model, model_name: str, decoded: Decoded,
                    outputs: Mapping[str, np.ndarray]) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary tensors, the length of its JSON header. ``outputs`` are the
    model's, or the post-processing's (strings among them: BYTES); a name asked for that it did not make is a
    :class:`RequestError`."""
    dtypes = {spec.name: spec.dtype for spec in model.outputs}
    chosen = decoded.outputs if decoded.outputs is not None else [(name, decoded.binary) for name in outputs]
    unknown = [name for name, _ in chosen if name not in outputs]
    if unknown:
        raise RequestError(400, f"unknown output {unknown[0]!r}; the outputs are {', '.join(outputs)}")
    tensors, blobs = [], []
    for name, binary in chosen:
        array = np.asarray(outputs[name])
        if array.dtype.kind in "SU":
            tensor, blob = _bytes_tensor(name, array, binary)
        else:
            if name in dtypes and dtypes[name] in DATATYPES:  # as the metadata says, whatever the precision
                array = array.astype(dtypes[name], copy=False)
            if array.dtype.name not in DATATYPES:
                raise ModelFailure(f"output {name} has dtype {array.dtype}, which this server cannot send")
            tensor = {"name": name, "datatype": DATATYPES[array.dtype.name], "shape": list(array.shape)}
            blob = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes() if binary else None
            if blob is None:
                tensor["data"] = array.reshape(-1).tolist()
        if blob is not None:
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        tensors.append(tensor)
    response: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": tensors}
    if decoded.id is not None:
        response["id"] = decoded.id
    header = json.dumps(response, separators=(",", ":")).encode()
    return (header + b"".join(blobs), len(header)) if blobs else (header, None)


def _bytes_tensor(name: str, array: np.ndarray, binary: bool) -> tuple[dict[str, Any], bytes | None]:
    """A BYTES output of strings: JSON strings, or binary elements (a 4-byte little-endian length, then UTF-8)."""
    items = [item.decode() if isinstance(item, bytes) else str(item) for item in array.reshape(-1).tolist()]
    tensor: dict[str, Any] = {"name": name, "datatype": "BYTES", "shape": list(array.shape)}
    if not binary:
        tensor["data"] = items
        return tensor, None
    encoded = [item.encode() for item in items]
    return tensor, b"".join(len(item).to_bytes(4, "little") + item for item in encoded)
