"""The build's smoke test of ``modak serve``: the model served on a loopback port answers one infer request as
:meth:`~modak.runtime.Model.run` does."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np

from modak.image.text import TEXT_INPUT
from modak.runtime import Model
from modak.runtime.serve.app import bind, build_app
from modak.runtime.serve.protocol import DATATYPES, DTYPES
from modak.runtime.serve.settings import Settings

SELF_CHECK_SAMPLES = 3
SELF_CHECK_TEXTS = ("The smoke test's first sentence.", "A second, longer one: served through the tokenizer.")


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
        result = {"status": "ok", "url": url, "latency_s": round(latency, 6),
                  "outputs": {name: list(a.shape) for name, a in got.items()}}
        if model.text is not None:  # and as text, through the job's tokenizer
            expected = model.run(model.encode_text(SELF_CHECK_TEXTS))
            request = {"inputs": [{"name": TEXT_INPUT, "shape": [len(SELF_CHECK_TEXTS)], "datatype": "BYTES",
                                   "data": list(SELF_CHECK_TEXTS)}]}
            answer = _post(f"{url}/models/model/infer", request, max(1.0, deadline - time.monotonic()))
            for output in answer["outputs"]:
                array = np.asarray(output["data"], DTYPES[output["datatype"]]).reshape(output["shape"])
                if not np.allclose(array, expected[output["name"]], rtol=1e-5, atol=1e-6):
                    raise RuntimeError(f"output {output['name']} of a text request differs from Model.run's")
            result["text_outputs"] = {o["name"]: o["shape"] for o in answer["outputs"]}
        return result
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
