"""The Starlette app of ``modak serve``: the protocol's endpoints for one model, errors as JSON, metrics, and the
socket it listens on."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import modak
from modak.runtime import FeedError, Model
from modak.runtime.serve.batching import DynamicBatcher
from modak.runtime.serve.metrics import Metrics
from modak.runtime.serve.protocol import (
    DATATYPES,
    HEADER_LENGTH,
    ModelFailure,
    RequestError,
    decode_request,
    encode_response,
)
from modak.runtime.serve.settings import Settings, resolve

log = logging.getLogger(__name__)

OFF_LOOP_BYTES = 256 << 10  # larger bodies are decoded in a thread, off the event loop


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
        self.batcher: DynamicBatcher | None = None

    @asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        self.batcher = DynamicBatcher(self.model, self.limits, self.metrics)
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

        processor = self.model.preprocessor
        raw = [{"name": processor.input_name, "datatype": "BYTES", "shape": [-1]}] if processor is not None else []
        return {"name": self.name, "versions": ["1"], "platform": self.model.deployment.runtime,
                "inputs": raw + tensors(self.model.inputs), "outputs": tensors(self.model.outputs)}

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
        if len(body) > OFF_LOOP_BYTES or self.model.preprocessor is not None:  # parsing a large body (or decoding
            # images, tokenizing) would hold up every other request
            decoded = await asyncio.to_thread(decode_request, body, header, self.model, self.limits)
        else:
            decoded = decode_request(body, header, self.model, self.limits)
        if decoded.preprocess_s is not None:
            self.metrics.preprocess.observe(decoded.preprocess_s)
        assert self.batcher is not None
        outputs = await self.batcher.submit(decoded.feeds, decoded.samples)
        if decoded.raw and self.model.postprocessor is not None:
            start = time.perf_counter()
            try:
                outputs = await asyncio.to_thread(self.model.postprocess, outputs, decoded.samples)
            except FeedError as exc:
                raise ModelFailure(f"post-processing: {exc}") from None
            self.metrics.postprocess.observe(time.perf_counter() - start)
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
