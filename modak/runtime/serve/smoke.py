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

from modak.runtime import Model
from modak.runtime.serve.app import bind, build_app
from modak.runtime.serve.protocol import DATATYPES, DTYPES, HEADER_LENGTH
from modak.runtime.serve.settings import Settings

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
        result = {"status": "ok", "url": url, "latency_s": round(latency, 6),
                  "outputs": {name: list(a.shape) for name, a in got.items()}}
        items = model.sample_items()
        if items:  # and as raw items, through the job's pre- and post-processing
            assert model.preprocessor is not None
            result["raw_outputs"] = _check_raw(model, model.preprocessor.input_name, items,
                                               f"{url}/models/model/infer", max(1.0, deadline - time.monotonic()))
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


def _check_raw(model: Model, name: str, items: list[bytes | str], url: str, timeout_s: float) -> dict[str, list[int]]:
    """Send ``items`` as the BYTES input ``name`` (binary data); the answer must be what the pre-processing,
    Model.run and the post-processing make of them. The answer's output shapes."""
    expected = model.postprocess(model.run(model.encode(items)), len(items))
    blob = b"".join(len(data).to_bytes(4, "little") + data
                    for data in (item.encode() if isinstance(item, str) else item for item in items))
    answer = _post(url, {"inputs": [{"name": name, "shape": [len(items)], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(blob)}}]}, timeout_s, blob)
    answered = sorted(o["name"] for o in answer["outputs"])
    if answered != sorted(expected):
        raise RuntimeError(f"a request of raw items ({name}) was answered {answered}, expected {sorted(expected)}")
    for output in answer["outputs"]:
        want = np.asarray(expected[output["name"]])
        if output["datatype"] == "BYTES":
            same = output["data"] == [str(v) for v in want.reshape(-1).tolist()]
        else:
            array = np.asarray(output["data"], DTYPES[output["datatype"]]).reshape(output["shape"])
            same = array.shape == want.shape and bool(np.allclose(array, want, rtol=1e-5, atol=1e-6))
        if not same:
            raise RuntimeError(f"output {output['name']} of a request of raw items ({name}) differs from Model.run's")
    return {o["name"]: o["shape"] for o in answer["outputs"]}


def _post(url: str, document: dict[str, Any], timeout_s: float, binary: bytes = b"") -> dict[str, Any]:
    header = json.dumps(document).encode()
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))} if binary else {
        "Content-Type": "application/json"}
    request = urllib.request.Request(url, header + binary, headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:500]}") from None
