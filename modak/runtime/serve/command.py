"""The ``modak serve`` command: its arguments, and serving the image's model until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from pathlib import Path

from modak.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_RUN_FAILED
from modak.image.deployment import PLAN_VARIABLE, location
from modak.runtime.serve.app import bind, build_app
from modak.runtime.serve.settings import Settings, resolve

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


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
        return EXIT_BAD_INPUT
    try:
        model = load()
    except Exception as exc:
        print(f"modak serve: cannot load the model: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_RUN_FAILED
    if model.request.task != "inference":
        print(f"modak serve: this image's deployment is for {model.request.task}, not inference", file=sys.stderr)
        return EXIT_BAD_INPUT
    settings = Settings(name, args.max_batch, args.max_queue_delay_ms, args.max_queue, args.max_body_mb,
                        args.max_request_samples)
    try:
        app = build_app(model, settings)
        sock = bind(args.host, args.port)
    except ValueError as exc:
        print(f"modak serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"modak serve: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_RUN_FAILED
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
    return EXIT_OK if server.started else EXIT_RUN_FAILED


def _plan_job_name() -> str | None:
    try:
        name = json.loads(Path(location(PLAN_VARIABLE)).read_text(encoding="utf-8")).get("job")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and _NAME.fullmatch(name) else None
