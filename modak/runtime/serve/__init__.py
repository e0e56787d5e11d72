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
the parallel work) and its outputs are split back. A request larger than ``--max-batch`` runs alone
(:meth:`Model.run` cuts it into steps). When a batch of several requests fails, each is run again alone, so that
only the faulty one gets the error.

Limits: bodies over ``--max-body-mb`` are refused with 413 (a declared Content-Length at once; a chunked body as
soon as it passes the limit; the rest is discarded unread); so are requests with more samples than
``--max-request-samples`` (default: as many as fit in the body limit, as decoded inputs and outputs). More than
``--max-queue`` waiting requests, or queued inputs over four body limits, are refused with 503. Every refusal is a
4xx/503 with ``{"error": message}``; a failure inside the runtime is a 500, logged, and the server keeps serving.
SIGTERM or SIGINT stops accepting connections, finishes the requests in flight, drains the queue and exits 0.

The package, one job per module: :mod:`~modak.runtime.serve.settings` (settings and the limits they give),
:mod:`~modak.runtime.serve.protocol` (the v2 codec), :mod:`~modak.runtime.serve.metrics`,
:mod:`~modak.runtime.serve.batching` (the dynamic batcher), :mod:`~modak.runtime.serve.app` (the Starlette app),
:mod:`~modak.runtime.serve.command` (``modak serve``) and :mod:`~modak.runtime.serve.smoke` (the build's
smoke test of the server).
"""

from __future__ import annotations

from modak.runtime.serve.app import build_app
from modak.runtime.serve.command import configure, main
from modak.runtime.serve.settings import Settings
from modak.runtime.serve.smoke import self_check

__all__ = ["Settings", "build_app", "configure", "main", "self_check"]
