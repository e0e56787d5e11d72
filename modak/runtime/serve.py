"""``modak serve``: the image's model behind the Open Inference Protocol (KServe v2 REST), with dynamic batching.

Endpoints (the protocol's REST subset for one model, version ``1``)::

    GET  /v2/health/live  /v2/health/ready               200 (ready: 503 once shutting down)
    GET  /v2                                              server metadata (name, version, extensions)
    GET  /v2/models/NAME[/versions/1]                     model metadata: inputs/outputs, v2 datatypes, shape [-1, ...]
    GET  /v2/models/NAME[/versions/1]/ready               200
    POST /v2/models/NAME[/versions/1]/infer               inference
    GET  /metrics                                         Prometheus text

An infer request carries every model input as ``{"name", "shape", "datatype", "data"}`` (``data`` flat or
nested, row-major) or, with the binary tensor data extension that the reference client uses by default, as raw
little-endian bytes after the JSON header (``Inference-Header-Content-Length`` and ``binary_data_size``).
``outputs`` may select outputs and ask for each as JSON or binary (``parameters.binary_data``; the request's
``parameters.binary_data_output`` sets the default); ``id`` is echoed. The datatype must be the model's own
(no silent conversions); BYTES tensors, classification and compressed bodies are not supported.

Dynamic batching: requests wait in a bounded queue; whenever the worker is free, a batcher on the event loop
takes the oldest one and the following ones while their samples fit in ``--max-batch``. By default it waits for
nothing (Triton's and Ray Serve's default): a lone request runs at once, and requests that arrive while a step
runs form the next batch. ``--max-queue-delay-ms`` waits at most that long after the oldest arrived for a fuller
batch; ``--max-batch 1`` turns batching off (one request per step). The batch runs as ONE
:meth:`Model.run` in a single worker thread (a session is not assumed thread-safe; the runtime's own threads do
the parallel work) and its outputs are split back. A request larger than ``--max-batch`` runs alone (:meth:`Model.run` cuts it into steps).
When a batch of several requests fails, each is run again alone, so that only the faulty one gets the error.

Limits: bodies over ``--max-body-mb`` are refused with 413 (a declared Content-Length at once; a chunked body as
soon as it passes the limit; the rest is discarded unread); so are requests with more samples than
``--max-request-samples`` (default: as many as fit in the body limit, as decoded inputs and outputs). More than
``--max-queue`` waiting requests, or queued inputs over four body limits, are refused with 503. Every refusal is a
4xx/503 with ``{"error": message}``; a failure inside the runtime is a 500, logged, and the server keeps serving.
SIGTERM or SIGINT stops accepting connections, finishes the requests in flight, drains the queue and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import modak
from modak.image.deployment import PLAN_VARIABLE, location
from modak.runtime import InputError, Model

__all__ = ["Settings", "build_app", "configure", "main", "self_check"]

log = logging.getLogger("modak.serve")

EXIT_USAGE = 2
EXIT_FAILED = 3
MB = 1 << 20
QUEUED_BODIES = 4  # queued input bytes may reach this many body limits
OFF_LOOP_BYTES = 256 << 10  # larger bodies are decoded in a thread, off the event loop
HEADER_LENGTH = "Inference-Header-Content-Length"
# v2 datatype <-> NumPy dtype name (BYTES and BF16 have no NumPy counterpart here).
DATATYPES = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
             "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
             "float32": "FP32", "float64": "FP64"}
DTYPES = {v2: np.dtype(name) for name, v2 in DATATYPES.items()}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class RequestError(Exception):
    """A request refused with ``status`` and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ModelFailure(Exception):
    """The runtime raised while running a batch (a 500)."""


@dataclass(frozen=True)
class Settings:
    """What the app serves and its limits (0 for ``max_batch``/``max_request_samples``: derived from the model)."""

    model_name: str = "model"
    max_batch: int = 0
    max_queue_delay_ms: float = 0.0
    max_queue: int = 64
    max_body_mb: float = 64.0
    max_request_samples: int = 0


@dataclass(frozen=True)
class Limits:
    """:class:`Settings` resolved for one model."""

    max_batch: int
    delay_s: float
    max_queue: int
    max_body: int
    max_request_samples: int
    max_queued_bytes: int


def resolve(model: Model, settings: Settings) -> Limits:
    """The limits ``settings`` give for ``model``; ValueError when one is out of range."""
    max_batch = settings.max_batch or model.capacity
    if not 1 <= max_batch <= model.capacity:
        raise ValueError(f"--max-batch must be between 1 and the model's capacity, {model.capacity}")
    if settings.max_queue_delay_ms < 0 or settings.max_queue < 1 or settings.max_body_mb <= 0:
        raise ValueError("--max-queue-delay-ms must be >= 0, --max-queue >= 1 and --max-body-mb > 0")
    if settings.max_request_samples < 0:
        raise ValueError("--max-request-samples must be >= 0")
    max_body = max(1, int(settings.max_body_mb * MB))
    sample_bytes = sum(math.prod(max(d, 1) for d in spec.shape) * np.dtype(spec.dtype).itemsize
                       for spec in (*model.inputs, *model.outputs))
    samples = settings.max_request_samples or max(max_batch, max_body // max(sample_bytes, 1))
    return Limits(max_batch, settings.max_queue_delay_ms / 1e3, settings.max_queue, max_body, samples,
                  QUEUED_BODIES * max_body)


# ----------------------------------------------------------------------------------------------------- protocol
@dataclass
class Decoded:
    """An infer request, checked: the model's inputs as arrays and the outputs to return."""

    feeds: dict[str, np.ndarray]
    samples: int
    outputs: list[tuple[str, bool]]  # name, binary
    id: str | None = None


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
    except InputError as exc:
        raise RequestError(400, str(exc)) from None
    return Decoded(feeds, len(next(iter(feeds.values()))),
                   _requested_outputs(request.get("outputs"), model, bool(parameters.get("binary_data_output"))),
                   request_id)


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


def _requested_outputs(outputs: object, model: Model, binary_default: bool) -> list[tuple[str, bool]]:
    names = [spec.name for spec in model.outputs]
    if outputs is None:
        return [(name, binary_default) for name in names]
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise RequestError(400, "outputs must be a list of objects")
    chosen = []
    for output in outputs:
        name = output.get("name")
        if name not in names:
            raise RequestError(400, f"unknown output {name!r}; the model's outputs are {', '.join(names)}")
        parameters = _object(output.get("parameters"), f"output {name} parameters")
        if parameters.get("classification"):
            raise RequestError(400, "classification outputs are not supported")
        chosen.append((name, bool(parameters.get("binary_data", binary_default))))
    return chosen


def encode_response(model: Model, model_name: str, decoded: Decoded,
                    outputs: Mapping[str, np.ndarray]) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary tensors, the length of its JSON header."""
    dtypes = {spec.name: spec.dtype for spec in model.outputs}
    tensors, blobs = [], []
    for name, binary in decoded.outputs:
        array = np.asarray(outputs[name])
        if dtypes[name] in DATATYPES:  # as the metadata says, whatever the runtime's precision
            array = array.astype(dtypes[name], copy=False)
        if array.dtype.name not in DATATYPES:
            raise ModelFailure(f"output {name} has dtype {array.dtype}, which this server cannot send")
        tensor: dict[str, Any] = {"name": name, "datatype": DATATYPES[array.dtype.name], "shape": list(array.shape)}
        if binary:
            blob = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            tensor["data"] = array.reshape(-1).tolist()
        tensors.append(tensor)
    response: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": tensors}
    if decoded.id is not None:
        response["id"] = decoded.id
    header = json.dumps(response, separators=(",", ":")).encode()
    return (header + b"".join(blobs), len(header)) if blobs else (header, None)


# ------------------------------------------------------------------------------------------------------ metrics
class Metrics:
    """The server's Prometheus metrics, in a registry of its own."""

    def __init__(self, max_batch: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        sizes = sorted({2 ** i for i in range(max_batch.bit_length())} | {max_batch})
        self.requests = Counter("modak_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "code"], registry=self.registry)
        self.latency = Histogram("modak_request_seconds", "Seconds from a request's arrival to its response",
                                 ["endpoint"], registry=self.registry)
        self.batch_size = Histogram("modak_batch_size", "Samples per model step (dynamic batches)",
                                    buckets=[float(s) for s in sizes], registry=self.registry)
        self.batch_requests = Histogram("modak_batch_requests", "Requests per model step",
                                        buckets=[float(s) for s in sizes], registry=self.registry)
        self.inference = Histogram("modak_inference_seconds", "Seconds of one Model.run on a batch",
                                   registry=self.registry)
        self.queue_depth = Gauge("modak_queue_depth", "Requests waiting for a batch", registry=self.registry)

    def text(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


# ------------------------------------------------------------------------------------------------------ batcher
@dataclass(eq=False)
class _Pending:
    feeds: dict[str, np.ndarray]
    samples: int
    nbytes: int
    future: asyncio.Future[dict[str, np.ndarray]]
    arrival: float


@dataclass(eq=False)
class Batcher:
    """Dynamic batching: requests queue on the event loop and run in batches in one worker thread."""

    model: Model
    limits: Limits
    metrics: Metrics
    _pending: deque[_Pending] = field(default_factory=deque)
    _queued_bytes: int = 0
    _closing: bool = False
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="modak-infer"))
    _task: asyncio.Task[None] | None = None

    @property
    def closing(self) -> bool:
        return self._closing

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="modak-batcher")

    async def close(self) -> None:
        """Refuse new requests, run the queued ones, stop the worker."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    def submit(self, feeds: dict[str, np.ndarray], samples: int) -> Awaitable[dict[str, np.ndarray]]:
        """Queue one request; its outputs come through the returned future (:class:`RequestError` 503 when the
        queue is full or the server is stopping)."""
        if self._closing:
            raise RequestError(503, "the server is shutting down")
        nbytes = sum(a.nbytes for a in feeds.values())
        if len(self._pending) >= self.limits.max_queue or (
                self._pending and self._queued_bytes + nbytes > self.limits.max_queued_bytes):
            raise RequestError(503, f"the queue is full ({len(self._pending)} requests waiting); retry later")
        loop = asyncio.get_running_loop()
        pending = _Pending(feeds, samples, nbytes, loop.create_future(), loop.time())
        self._pending.append(pending)
        self._queued_bytes += nbytes
        self.metrics.queue_depth.set(len(self._pending))
        self._wake.set()
        return pending.future

    def _fits(self) -> tuple[int, bool]:
        """How many queued requests (from the oldest) the next batch takes, and whether it is full."""
        taken, samples = 0, 0
        for pending in self._pending:
            if taken and samples + pending.samples > self.limits.max_batch:
                return taken, True
            taken, samples = taken + 1, samples + pending.samples
        return taken, samples >= self.limits.max_batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            deadline = self._pending[0].arrival + self.limits.delay_s
            while not self._closing and not self._fits()[1] and loop.time() < deadline:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), deadline - loop.time())
                except asyncio.TimeoutError:
                    break
            batch = [self._pending.popleft() for _ in range(self._fits()[0])]
            self._queued_bytes -= sum(p.nbytes for p in batch)
            self.metrics.queue_depth.set(len(self._pending))
            try:
                results = await loop.run_in_executor(self._executor, self._run, batch)
            except Exception as exc:  # the executor itself failed: answer the batch, keep the loop alive
                log.exception("modak serve: the batch could not run")
                results = [ModelFailure(f"{type(exc).__name__}: {exc}")] * len(batch)
            for pending, result in zip(batch, results):
                if pending.future.done():
                    continue
                if isinstance(result, BaseException):
                    pending.future.set_exception(result)
                else:
                    pending.future.set_result(result)

    def _run(self, batch: list[_Pending]) -> list[dict[str, np.ndarray] | BaseException]:
        """Outputs of each request of ``batch`` (worker thread); when the batch fails, each request alone."""
        try:
            return self._step(batch)
        except Exception as exc:
            if len(batch) == 1:
                log.error("modak serve: inference failed: %s: %s", type(exc).__name__, exc, exc_info=True)
                return [ModelFailure(f"inference failed: {type(exc).__name__}: {exc}")]
            log.warning("modak serve: a batch of %d requests failed (%s); running them one by one", len(batch), exc)
        return [result for pending in batch for result in self._run([pending])]

    def _step(self, batch: list[_Pending]) -> list[dict[str, np.ndarray] | BaseException]:
        names = batch[0].feeds
        feeds = {name: np.concatenate([p.feeds[name] for p in batch]) if len(batch) > 1 else batch[0].feeds[name]
                 for name in names}
        start = time.perf_counter()
        outputs = self.model.run(feeds)
        self.metrics.inference.observe(time.perf_counter() - start)
        self.metrics.batch_size.observe(sum(p.samples for p in batch))
        self.metrics.batch_requests.observe(len(batch))
        results: list[dict[str, np.ndarray] | BaseException] = []
        offset = 0
        for pending in batch:
            results.append({name: out[offset:offset + pending.samples] for name, out in outputs.items()})
            offset += pending.samples
        return results


# ---------------------------------------------------------------------------------------------------------- app
async def read_body(request: Any, limit: int) -> bytes:
    """The request's body, or :class:`RequestError` 413 as soon as it is known to exceed ``limit`` bytes."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise RequestError(413, f"the body has {length} bytes; this server takes at most {limit}")
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding != "identity":
        raise RequestError(415, f"Content-Encoding {encoding} is not supported (send the body uncompressed)")
    from starlette.requests import ClientDisconnect

    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"the body exceeds {limit} bytes, this server's limit")
            chunks.append(chunk)
    except ClientDisconnect:
        raise RequestError(400, "the client disconnected before the end of the body") from None
    return b"".join(chunks)


class _App:
    """The endpoints for one model; :func:`build_app` wires them."""

    def __init__(self, model: Model, settings: Settings) -> None:
        self.model, self.name = model, settings.model_name
        self.limits = resolve(model, settings)
        self.metrics = Metrics(self.limits.max_batch)
        self.batcher: Batcher | None = None

    @asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        self.batcher = Batcher(self.model, self.limits, self.metrics)
        self.batcher.start()
        try:
            yield
        finally:
            await self.batcher.close()

    def _ready(self) -> bool:
        return self.batcher is not None and not self.batcher.closing

    def _check_model(self, request: Any) -> None:
        name, version = request.path_params["name"], request.path_params.get("version", "1")
        if name != self.name or version != "1":
            raise RequestError(404, f"unknown model {name!r} version {version!r}; this server serves "
                                    f"{self.name!r} version '1'")

    async def live(self, request: Any) -> dict[str, Any]:
        return {"live": True}

    async def ready(self, request: Any) -> dict[str, Any]:
        if not self._ready():
            raise RequestError(503, "not ready")
        return {"ready": True}

    async def server_metadata(self, request: Any) -> dict[str, Any]:
        return {"name": "modak", "version": modak.__version__, "extensions": ["binary_tensor_data"]}

    async def model_metadata(self, request: Any) -> dict[str, Any]:
        self._check_model(request)

        def tensors(specs: tuple[Any, ...]) -> list[dict[str, Any]]:
            return [{"name": s.name, "datatype": DATATYPES.get(s.dtype, s.dtype.upper()), "shape": [-1, *s.shape]}
                    for s in specs]

        return {"name": self.name, "versions": ["1"], "platform": self.model.deployment.runtime,
                "inputs": tensors(self.model.inputs), "outputs": tensors(self.model.outputs)}

    async def model_ready(self, request: Any) -> dict[str, Any]:
        self._check_model(request)
        if not self._ready():
            raise RequestError(503, "not ready")
        return {"name": self.name, "ready": True}

    async def infer(self, request: Any) -> Any:
        from starlette.responses import Response

        self._check_model(request)
        body = await read_body(request, self.limits.max_body)
        header = request.headers.get(HEADER_LENGTH)
        if len(body) > OFF_LOOP_BYTES:  # parsing a large body would hold up every other request
            decoded = await asyncio.to_thread(decode_request, body, header, self.model, self.limits)
        else:
            decoded = decode_request(body, header, self.model, self.limits)
        assert self.batcher is not None
        outputs = await self.batcher.submit(decoded.feeds, decoded.samples)
        content, length = encode_response(self.model, self.name, decoded, outputs)
        if length is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type="application/octet-stream", headers={HEADER_LENGTH: str(length)})

    async def metrics_text(self, request: Any) -> Any:
        from starlette.responses import Response

        content, media_type = self.metrics.text()
        return Response(content, media_type=media_type)

    def endpoint(self, label: str, handler: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        """``handler`` answering errors as JSON, counted and timed under ``label``."""
        from starlette.responses import JSONResponse, Response

        async def answer(request: Any) -> Any:
            start = time.perf_counter()
            try:
                response = await handler(request)
                if not isinstance(response, Response):
                    response = JSONResponse(response)
            except RequestError as exc:
                response = error_response(exc.status, exc.message)
            except ModelFailure as exc:
                response = error_response(500, str(exc))
            except Exception as exc:  # a bug here must not take the server down: answer, log, go on
                log.exception("modak serve: %s failed", label)
                response = error_response(500, f"internal error: {type(exc).__name__}: {exc}")
            self.metrics.requests.labels(label, str(response.status_code)).inc()
            self.metrics.latency.labels(label).observe(time.perf_counter() - start)
            return response

        return answer


def error_response(status: int, message: str) -> Any:
    from starlette.responses import JSONResponse

    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def build_app(model: Model, settings: Settings) -> Any:
    """The Starlette app serving ``model`` (a prepared :class:`Model`) with ``settings``; ValueError for settings
    out of range. Its lifespan starts and drains the batcher."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    app = _App(model, settings)
    wrap = app.endpoint
    versions = "/v2/models/{name}/versions/{version}"
    routes = [
        Route("/v2/health/live", wrap("live", app.live)),
        Route("/v2/health/ready", wrap("ready", app.ready)),
        Route("/v2", wrap("server_metadata", app.server_metadata)),
        Route("/metrics", wrap("metrics", app.metrics_text)),
    ]
    for base in ("/v2/models/{name}", versions):
        routes += [Route(base, wrap("model_metadata", app.model_metadata)),
                   Route(f"{base}/ready", wrap("model_ready", app.model_ready)),
                   Route(f"{base}/infer", wrap("infer", app.infer), methods=["POST"])]

    async def http_error(request: Any, exc: Exception) -> Any:
        assert isinstance(exc, HTTPException)
        app.metrics.requests.labels("other", str(exc.status_code)).inc()
        return error_response(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")

    return Starlette(routes=routes, lifespan=app.lifespan, exception_handlers={HTTPException: http_error})


# -------------------------------------------------------------------------------------------------- the command
def configure(parser: argparse.ArgumentParser) -> None:
    """The ``modak serve`` arguments."""
    port = os.environ.get("MODAK_PORT", "")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=int(port) if port.isdigit() else 8080,
                        help="port (default $MODAK_PORT, else 8080; 0: any free port)")
    parser.add_argument("--model-name", default=os.environ.get("MODAK_MODEL_NAME"),
                        help="the model's name in URLs (default $MODAK_MODEL_NAME, else the plan's job, else 'model')")
    parser.add_argument("--max-batch", type=int, default=0,
                        help="most samples per dynamic batch (default: the model's capacity, its most; 1: batching "
                             "off)")
    parser.add_argument("--max-queue-delay-ms", type=float, default=0.0,
                        help="wait at most this long after a request for others to batch with (default 0: a batch "
                             "takes what is queued when the worker is free)")
    parser.add_argument("--max-queue", type=int, default=64, help="requests waiting at most; more get 503 (64)")
    parser.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body in MiB (64)")
    parser.add_argument("--max-request-samples", type=int, default=0,
                        help="most samples in one request (default: what fits in --max-body-mb, decoded)")
    parser.add_argument("--timeout-graceful", type=float, default=30.0,
                        help="seconds to finish requests in flight after SIGTERM (30)")
    parser.add_argument("--access-log", action="store_true", help="log every request")


def main(args: argparse.Namespace) -> int:
    """Load the model, then serve it until SIGTERM/SIGINT; 0 after a graceful shutdown."""
    import uvicorn

    from modak.runtime import load

    name = args.model_name or _plan_job_name() or "model"
    if not _NAME.fullmatch(name):
        print(f"modak serve: model name {name!r}: use letters, digits, '.', '_' and '-'", file=sys.stderr)
        return EXIT_USAGE
    try:
        model = load()
    except Exception as exc:
        print(f"modak serve: cannot load the model: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if model.request.task != "inference":
        print(f"modak serve: this image's deployment is for {model.request.task}, not inference", file=sys.stderr)
        return EXIT_USAGE
    settings = Settings(name, args.max_batch, args.max_queue_delay_ms, args.max_queue, args.max_body_mb,
                        args.max_request_samples)
    try:
        app = build_app(model, settings)
        sock = bind(args.host, args.port)
    except ValueError as exc:
        print(f"modak serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"modak serve: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    config = uvicorn.Config(app, http="h11", loop="asyncio", lifespan="on", access_log=args.access_log,
                            timeout_graceful_shutdown=args.timeout_graceful, server_header=False)
    server = uvicorn.Server(config)
    port = sock.getsockname()[1]
    print(f"modak serve: {name!r} ({model.deployment.runtime}, batch {model.batch_size}, "
          f"max batch {resolve(model, settings).max_batch}) on http://{args.host}:{port}/v2", file=sys.stderr,
          flush=True)
    # uvicorn re-raises the signal that stopped it once it is done: with these handlers, that ends nothing.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    return 0 if server.started else EXIT_FAILED


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (port 0: any free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY on accepted sockets only then (else Nagle adds 40 ms per answer)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def _plan_job_name() -> str | None:
    try:
        name = json.loads(Path(location(PLAN_VARIABLE)).read_text(encoding="utf-8")).get("job")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and _NAME.fullmatch(name) else None


# ---------------------------------------------------------------------------------------------------- self-check
SELF_CHECK_SAMPLES = 3


def self_check(model: Model, timeout_s: float = 60.0) -> dict[str, Any]:
    """Serve ``model`` on a free loopback port, send it one infer request (a few samples of
    :meth:`Model.example_inputs`) and compare the answer with :meth:`Model.run`: the build's smoke test."""
    import uvicorn

    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    sock: socket.socket | None = None
    try:
        feeds = {name: a[:SELF_CHECK_SAMPLES] for name, a in model.example_inputs().items()}
        expected = model.run(feeds)
        sock = bind("127.0.0.1", 0)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v2"
        config = uvicorn.Config(build_app(model, Settings()), http="h11", loop="asyncio",
                                lifespan="on", log_config=None, log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="modak-self-check",
                                  daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        request = {"id": "self-check", "inputs": [
            {"name": name, "shape": list(a.shape), "datatype": DATATYPES[a.dtype.name], "data": a.reshape(-1).tolist()}
            for name, a in feeds.items()]}
        start = time.perf_counter()
        answer = _post(f"{url}/models/model/infer", request, max(1.0, deadline - time.monotonic()))
        latency = time.perf_counter() - start
        got = {o["name"]: np.asarray(o["data"], DTYPES[o["datatype"]]).reshape(o["shape"])
               for o in answer["outputs"]}
        if set(got) != set(expected) or answer.get("id") != "self-check":
            raise RuntimeError(f"the response has outputs {sorted(got)}, expected {sorted(expected)}")
        for name, array in expected.items():
            if got[name].shape != array.shape or not np.allclose(got[name], array, rtol=1e-5, atol=1e-6):
                raise RuntimeError(f"output {name}: the server's {list(got[name].shape)} differs from Model.run's "
                                   f"{list(array.shape)}")
        return {"status": "ok", "url": url, "latency_s": round(latency, 6),
                "outputs": {name: list(a.shape) for name, a in got.items()}}
    except Exception as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(timeout=30)
        if sock is not None:
            sock.close()


def _post(url: str, document: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(document).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:500]}") from None

