"""``modak serve``: the real server in a subprocess (as the image starts it) against the reference Open Inference
Protocol client, dynamic batching, refusals, graceful shutdown; the app in-process for runtime failures and the
build's self-check."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import modak  # noqa: E402
from modak.image.deployment import Deployment  # noqa: E402
from modak.image.runtimes.base import RunRequest  # noqa: E402
from modak.runtime import (  # noqa: E402
    Model,
    TensorSpec,
    open_model,
    serve,  # noqa: E402
)
from modak.runtime.serve.app import bind  # noqa: E402
from modak.runtime.serve.settings import resolve  # noqa: E402
from modak.runtime.serve.smoke import SELF_CHECK_SAMPLES  # noqa: E402

BATCH = 4
SHAPE = [1, 28, 28]  # mnist_cnn's input, per sample


@pytest.fixture(scope="module")
def onnx_path() -> str:
    from modak.workload.zoo import export_onnx

    return str(export_onnx("mnist_cnn"))


@pytest.fixture(scope="module")
def reference(onnx_path):
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"input": x})[0]


class Server:
    """``modak serve`` in a subprocess, started through the image's launcher."""

    def __init__(self, onnx_path: str, folder: Path, *options: str) -> None:
        deployment = Deployment(runtime="onnxruntime", device="cpu", precision="fp32", task="inference",
                                params={"threads": 1}, env={}, batch_size=BATCH, input_shapes={"input": SHAPE},
                                zoo="mnist_cnn")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "plan.json").write_text(json.dumps({"deployment": deployment.to_dict()}))
        env = {**os.environ, "MODAK_PLAN": str(folder / "plan.json"), "MODAK_MODEL": onnx_path,
               "MODAK_WORKDIR": str(folder), "PYTHONPATH": str(Path(modak.__file__).parents[1])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "modak.image.launch", "--", sys.executable, "-m", "modak.runtime", "serve",
             "--host", "127.0.0.1", "--port", "0", *options],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: queue.Queue[str] = queue.Queue()
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.port = self._wait_for_port()
        self.url = f"127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while self.get("/v2/health/ready")[0] != 200:
            assert time.monotonic() < deadline and self.process.poll() is None, self.stderr()
            time.sleep(0.05)

    def _pump(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.put(line)

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = self.log.get(timeout=1)
            except queue.Empty:
                assert self.process.poll() is None, self.stderr()
                continue
            self.lines.append(line)
            if line.startswith("modak serve:") and "http://" in line:
                return int(line.rsplit(":", 1)[1].split("/")[0])
        raise AssertionError(f"the server did not start: {self.stderr()}")

    def stderr(self) -> str:
        while not self.log.empty():
            self.lines.append(self.log.get())
        return "".join(self.lines)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection(self.url, timeout=30)
        try:
            connection.request(method, path, body, headers or {})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        except ConnectionError:
            return 0, {}, b""
        finally:
            connection.close()

    def get(self, path: str) -> tuple[int, bytes]:
        status, _, body = self.request("GET", path)
        return status, body

    def infer(self, document: object, path: str = "/v2/models/model/infer",
              headers: dict[str, str] | None = None) -> tuple[int, dict]:
        status, _, body = self.request("POST", path, json.dumps(document).encode(), headers)
        return status, json.loads(body)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        from prometheus_client.parser import text_string_to_metric_families

        status, body = self.get("/metrics")
        assert status == 200
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(body.decode()) for s in family.samples}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(onnx_path, tmp_path_factory) -> Iterator[Server]:
    running = Server(onnx_path, tmp_path_factory.mktemp("serve"), "--max-body-mb", "1", "--max-request-samples", "64",
                     "--max-queue-delay-ms", "20")
    yield running
    running.stop()


def samples(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *SHAPE)).astype(np.float32)


def tensor(x: np.ndarray, **fields) -> dict:
    return {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist(), **fields}


def test_reference_client_metadata_and_inference(server, reference):
    import tritonclient.http as triton

    client = triton.InferenceServerClient(server.url)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("model")
        assert not client.is_model_ready("other")
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        metadata = client.get_model_metadata("model")
        assert metadata["platform"] == "onnxruntime"
        assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, *SHAPE]}]
        assert metadata["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 10]}]
        for n, binary_in, binary_out in [(3, True, True), (1, False, False), (9, True, False), (20, False, True)]:
            x = samples(n, seed=n)
            given = triton.InferInput("input", list(x.shape), "FP32")
            given.set_data_from_numpy(x, binary_data=binary_in)
            result = client.infer("model", [given], outputs=[triton.InferRequestedOutput("output", binary_out)],
                                  request_id=f"r{n}")
            assert result.get_response()["id"] == f"r{n}"
            assert result.as_numpy("output").shape == (n, 10)
            np.testing.assert_allclose(result.as_numpy("output"), reference(x), rtol=1e-4, atol=1e-5)
        x = samples(2, seed=7)
        given = triton.InferInput("input", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        result = client.infer("model", [given], model_version="1")  # no outputs named: all, binary
        np.testing.assert_allclose(result.as_numpy("output"), reference(x), rtol=1e-4, atol=1e-5)
        with pytest.raises(triton.InferenceServerException, match="unknown model"):
            client.infer("other", [given])
    finally:
        client.close()


def test_keep_alive_answers_are_not_held_back_by_nagle(server):
    connection = http.client.HTTPConnection(server.url, timeout=30)
    times = []
    for _ in range(7):  # Nagle's algorithm against delayed ACKs holds each answer back 40 ms
        start = time.perf_counter()
        connection.request("GET", "/v2/health/live")
        connection.getresponse().read()
        times.append(time.perf_counter() - start)
    connection.close()
    assert sorted(times)[3] < 0.02, times


def test_concurrent_requests_are_batched_and_answered_each_with_its_own_outputs(server, reference):
    before = server.metrics()
    threads, requests_each = 16, 3
    barrier = threading.Barrier(threads)
    failures: list[str] = []

    def client(index: int) -> None:
        barrier.wait()
        for round_ in range(requests_each):
            seed = 100 + index * requests_each + round_
            x = samples(1 + seed % 2, seed)
            status, answer = server.infer({"id": str(seed), "inputs": [tensor(x)]})
            if status != 200 or answer.get("id") != str(seed):
                failures.append(f"{seed}: {status} {answer}")
                continue
            out = np.asarray(answer["outputs"][0]["data"], np.float32).reshape(answer["outputs"][0]["shape"])
            if out.shape != (len(x), 10) or not np.allclose(out, reference(x), rtol=1e-4, atol=1e-5):
                failures.append(f"{seed}: wrong outputs")

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert not failures, failures
    after = server.metrics()

    def grown(name: str, labels: tuple = ()) -> float:
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    steps = grown("modak_batch_size_count")
    single = grown("modak_batch_size_bucket", (("le", "1.0"),))
    assert grown("modak_requests_total", (("code", "200"), ("endpoint", "infer"))) == threads * requests_each
    assert 0 < steps < threads * requests_each  # fewer steps than requests: they were batched
    assert steps - single > 0  # some step ran more than one sample
    assert grown("modak_batch_requests_count") - grown("modak_batch_requests_bucket", (("le", "1.0"),)) > 0
    assert grown("modak_batch_size_bucket", (("le", "4.0"),)) == steps  # never more than --max-batch
    assert after[("modak_queue_depth", ())] == 0
    assert grown("modak_inference_seconds_count") == steps


def _binary(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def _chunked_post(url: str, path: str, total: int, chunk: int = 1 << 16) -> tuple[int, bytes]:
    host, port = url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {url}\r\nTransfer-Encoding: chunked\r\n"
                     "Content-Type: application/json\r\n\r\n".encode())
        sent = 0
        while sent < total:
            sock.sendall(b"%x\r\n%s\r\n" % (chunk, b" " * chunk))
            sent += chunk
        sock.sendall(b"0\r\n\r\n")
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.read()


def test_bad_requests_are_refused_with_a_message_and_the_server_goes_on(server, reference):
    x = samples(2)
    good = {"inputs": [tensor(x)]}
    cases: list[tuple[str, int, str, object, dict[str, str] | None]] = [
        ("/v2/models/nope/infer", 404, "unknown model", good, None),
        ("/v2/models/model/versions/2/infer", 404, "unknown model", good, None),
        ("/v2/models/model/infer", 400, "malformed JSON", b'{"inputs": [', None),
        ("/v2/models/model/infer", 400, "JSON object", [], None),
        ("/v2/models/model/infer", 400, "inputs must be", {"inputs": []}, None),
        ("/v2/models/model/infer", 400, "unknown input 'image'", {"inputs": [tensor(x, name="image")]}, None),
        ("/v2/models/model/infer", 400, "appears twice", {"inputs": [tensor(x), tensor(x)]}, None),
        ("/v2/models/model/infer", 400, "does not fit", {"inputs": [tensor(samples(2)[:, :, :, :27])]}, None),
        ("/v2/models/model/infer", 400, "model takes FP32", {"inputs": [tensor(x, datatype="FP64")]}, None),
        ("/v2/models/model/infer", 400, "not a v2 datatype", {"inputs": [tensor(x, datatype="FLOAT32")]}, None),
        ("/v2/models/model/infer", 400, "needs 1568", {"inputs": [tensor(x, data=[0.5] * 1567)]}, None),
        ("/v2/models/model/infer", 400, "must be numbers", {"inputs": [tensor(x, data=["0.5"] * 1568)]}, None),
        ("/v2/models/model/infer", 400, "unevenly", {"inputs": [tensor(x, data=[[0.5] * 784, [0.5]])]}, None),
        ("/v2/models/model/infer", 400, "non-negative integers", {"inputs": [tensor(x, shape=[2, 1, 28, "28"])]},
         None),
        ("/v2/models/model/infer", 400, "at least 1", {"inputs": [tensor(samples(0))]}, None),
        ("/v2/models/model/infer", 400, "unknown output", {**good, "outputs": [{"name": "logits"}]}, None),
        ("/v2/models/model/infer", 400, "Inference-Header-Content-Length", good,
         {"Inference-Header-Content-Length": "100000"}),
        ("/v2/models/model/infer", 413, "at most 64", {"inputs": [tensor(samples(65)[:, :, :1, :1])]}, None),
    ]
    for path, status, message, document, headers in cases:
        body = document if isinstance(document, bytes) else json.dumps(document).encode()
        got, _, answer = server.request("POST", path, body, headers)
        assert (got, message in json.loads(answer).get("error", "")) == (status, True), (path, message, answer)

    header_only, headers = _binary(x)
    got, _, answer = server.request("POST", "/v2/models/model/infer", header_only[:-8], headers)
    assert got == 400 and "binary_data_size" in json.loads(answer)["error"]
    got, _, answer = server.request("POST", "/v2/models/model/infer", *_binary(samples(65)))
    assert got == 413 and "at most 64 per request" in json.loads(answer)["error"]
    got, _, answer = server.request("POST", "/v2/models/model/infer", b" " * (1 << 20 | 1))  # over --max-body-mb 1
    assert got == 413 and "at most 1048576" in json.loads(answer)["error"]
    got, answer = _chunked_post(server.url, "/v2/models/model/infer", (1 << 20) + (1 << 16))
    assert got == 413 and "exceeds" in json.loads(answer)["error"]
    got, _, answer = server.request("POST", "/v2/models/model/infer", json.dumps(good).encode(),
                                    {"Content-Encoding": "gzip"})
    assert got == 415 and "Content-Encoding" in json.loads(answer)["error"]
    got, _, answer = server.request("GET", "/v2/models/model/infer")
    assert got == 405 and "error" in json.loads(answer)
    assert server.get("/v2/models/nope")[0] == 404 and server.get("/nowhere")[0] == 404

    status, answer = server.infer(good)  # still serving
    assert status == 200
    np.testing.assert_allclose(np.reshape(answer["outputs"][0]["data"], (2, 10)), reference(x), rtol=1e-4, atol=1e-5)
    body, headers = _binary(x)  # just fits: the binary path still works after the refusals
    assert server.request("POST", "/v2/models/model/infer", body, headers)[0] == 200
    counts = server.metrics()
    assert counts[("modak_requests_total", (("code", "400"), ("endpoint", "infer")))] >= 15
    assert counts[("modak_requests_total", (("code", "413"), ("endpoint", "infer")))] >= 4


@pytest.mark.slow
def test_full_queue_is_refused_and_sigterm_finishes_requests_in_flight(onnx_path, reference, tmp_path):
    server = Server(onnx_path, tmp_path, "--max-queue", "2", "--max-queue-delay-ms", "2000")
    try:
        x = samples(1)
        results: list[tuple[int, dict]] = []

        def send(count: int) -> list[threading.Thread]:
            threads = [threading.Thread(target=lambda: results.append(server.infer({"inputs": [tensor(x)]})))
                       for _ in range(count)]
            for thread in threads:
                thread.start()
            return threads

        for thread in send(6):  # two wait for a batch that never fills: the others find the queue full
            thread.join(timeout=30)
        assert sorted(status for status, _ in results) == [200, 200, 503, 503, 503, 503]
        assert all("queue is full" in answer["error"] for status, answer in results if status == 503)

        results.clear()
        in_flight = send(2)
        deadline = time.monotonic() + 10
        while server.metrics().get(("modak_queue_depth", ())) != 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert server.get("/v2/health/live")[0] == 0  # no longer accepting connections
        for thread in in_flight:
            thread.join(timeout=30)
        assert [status for status, _ in results] == [200, 200]
        for _, answer in results:
            np.testing.assert_allclose(np.reshape(answer["outputs"][0]["data"], (1, 10)), reference(x), rtol=1e-4,
                                       atol=1e-5)
        assert server.process.wait(timeout=30) == 0, server.stderr()
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------------- in-process
class FakeSession:
    """y = 2 x + sum(ids) per sample; raises on NaN (a runtime failure)."""

    def __init__(self, noise: bool = False, seconds: float = 0.0) -> None:
        self.noise, self.seconds = noise, seconds
        self.steps: list[int] = []
        self.running = threading.Event()  # set when a step starts

    def run(self, feeds):
        x, ids = feeds["x"], feeds["ids"]
        if np.isnan(x).any():
            raise RuntimeError("NaN in x")
        self.running.set()
        time.sleep(self.seconds)
        self.steps.append(len(x))
        y = 2 * x + ids.sum(axis=1, keepdims=True)
        return [y + np.random.default_rng().standard_normal(y.shape) if self.noise else y]


def fake_model(session: FakeSession, batch_size: int = 4) -> Model:
    deployment = Deployment(runtime="fake", device="cpu", precision="fp32", task="inference", params={}, env={},
                            batch_size=batch_size, input_shapes={"x": [3], "ids": [2]})
    request = RunRequest(runtime="fake", device="cpu", precision="fp32", params={}, threads=1, task="inference",
                         onnx_path="", zoo=None, batch_size=batch_size, input_shapes={"x": [3], "ids": [2]}, workdir="")
    rng = np.random.default_rng(0)
    sample = {"x": rng.standard_normal((batch_size, 3)).astype(np.float32), "ids": rng.integers(0, 9, (batch_size, 2))}
    return Model(deployment, request, session, (TensorSpec("x", (3,), "float32"), TensorSpec("ids", (2,), "int64")),
                 (TensorSpec("y", (3,), "float32"),), sample)


@contextlib.contextmanager
def in_thread(model: Model, settings: serve.Settings) -> Iterator[str]:
    import uvicorn

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(serve.build_app(model, settings), log_config=None, log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _post(url: str, document: object) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/v2/models/model/infer", json.dumps(document).encode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _fake_inputs(x: list[list[float]], ids: list[list[int]], **fields) -> dict:
    return {"inputs": [{"name": "x", "shape": [len(x), 3], "datatype": "FP32", "data": x},
                       {"name": "ids", "shape": [len(ids), 2], "datatype": "INT64", "data": ids, **fields}]}


def test_a_failing_request_in_a_batch_fails_alone_and_the_server_goes_on():
    session = FakeSession()
    with in_thread(fake_model(session), serve.Settings(max_queue_delay_ms=300)) as url:
        documents = [_fake_inputs([[1.0, 2.0, 3.0]], [[1, 2]]), _fake_inputs([[float("nan")] * 3], [[0, 0]]),
                     _fake_inputs([[0.5, 0.0, -1.0], [1.0, 1.0, 1.0]], [[10, 0], [0, 0]])]
        answers: list[tuple[int, dict] | None] = [None] * 3

        def send(i: int) -> None:
            answers[i] = _post(url, documents[i])

        threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        statuses = [a[0] for a in answers if a]
        assert statuses == [200, 500, 200], answers
        assert "NaN in x" in answers[1][1]["error"]
        assert answers[0][1]["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1, 3], "data": [5, 7, 9]}]
        assert answers[2][1]["outputs"][0]["data"] == [11, 10, 8, 2, 2, 2]
        status, answer = _post(url, _fake_inputs([[0.0, 0.0, 0.0]], [[1, 1]]))
        assert status == 200 and answer["outputs"][0]["data"] == [2, 2, 2]
        for bad, message in [(_fake_inputs([[0.0] * 3], [[1, 2]])["inputs"][:1], "missing ids"),
                             (_fake_inputs([[0.0] * 3], [[2 ** 63, 0]])["inputs"], "integers in the range of INT64"),
                             (_fake_inputs([[0.0] * 3], [[1.5, 0]])["inputs"], "integers in the range of INT64"),
                             (_fake_inputs([[0.0] * 3], [[-2 ** 63 - 1, 0]])["inputs"], "range of INT64"),
                             (_fake_inputs([[0.0] * 3], [[True, False]])["inputs"], "range of INT64"),
                             (_fake_inputs([[None] * 3], [[1, 0]])["inputs"], "must be numbers FP32"),
                             (_fake_inputs([[0.0] * 3], [[1, 2], [3, 4]])["inputs"], "same number of samples")]:
            status, answer = _post(url, {"inputs": bad})
            assert status == 400 and message in answer["error"], answer


def _batch_requests(url: str) -> tuple[float, float]:
    """(steps, requests) the server's batch-requests histogram counted."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        samples = {s.name: s.value for f in text_string_to_metric_families(response.read().decode())
                   for s in f.samples if f.name == "modak_batch_requests"}
    return samples["modak_batch_requests_count"], samples["modak_batch_requests_sum"]


def _post_all(url: str, values: list[int], answers: list[tuple[int, dict]]) -> list[threading.Thread]:
    threads = [threading.Thread(target=lambda i=i: answers.append(_post(url, _fake_inputs([[i, 0, 0]], [[0, 0]]))))
               for i in values]
    for thread in threads:
        thread.start()
    return threads


def test_max_batch_one_runs_one_request_per_step():
    with in_thread(fake_model(FakeSession(seconds=0.05)), serve.Settings(max_batch=1)) as url:
        answers: list[tuple[int, dict]] = []
        for thread in _post_all(url, list(range(6)), answers):
            thread.join(timeout=30)
        assert sorted(a[1]["outputs"][0]["data"][0] for a in answers) == [0, 2, 4, 6, 8, 10]
        assert _batch_requests(url) == (6, 6)


def test_without_a_delay_the_requests_that_arrive_during_a_step_are_the_next_batch():
    """The default batcher (no queue delay) still batches: the first request is a step of its own, and the three
    that arrive while it runs are the next step, together (not three steps, as a delay of 0 once meant)."""
    session = FakeSession(seconds=0.5)
    assert serve.Settings().max_queue_delay_ms == 0
    with in_thread(fake_model(session), serve.Settings(max_queue_delay_ms=0)) as url:
        answers: list[tuple[int, dict]] = []
        first = _post_all(url, [1], answers)
        assert session.running.wait(timeout=30)
        for thread in first + _post_all(url, [2, 3, 4], answers):
            thread.join(timeout=30)
        assert sorted(a[1]["outputs"][0]["data"][0] for a in answers) == [2, 4, 6, 8]
        assert _batch_requests(url) == (2, 4)


def test_settings_out_of_range_are_refused():
    model = fake_model(FakeSession())
    with pytest.raises(ValueError, match="capacity, 4"):
        serve.build_app(model, serve.Settings(max_batch=5))
    limits = resolve(model, serve.Settings(max_body_mb=1))
    assert (limits.max_batch, limits.max_request_samples) == (4, (1 << 20) // (3 * 4 + 2 * 8 + 3 * 4))


def test_self_check(onnx_path, tmp_path):
    request = RunRequest(runtime="onnxruntime", device="cpu", precision="fp32", params={}, threads=1,
                         task="inference", onnx_path=onnx_path, zoo="mnist_cnn", batch_size=BATCH,
                         input_shapes={"input": SHAPE}, workdir=str(tmp_path))
    result = serve.self_check(open_model(request))
    assert result["status"] == "ok", result
    assert result["outputs"] == {"output": [SELF_CHECK_SAMPLES, 10]} and result["latency_s"] > 0
    broken = serve.self_check(fake_model(FakeSession(noise=True)))  # answers that differ from Model.run's
    assert broken["status"] == "error" and "differs" in broken["error"]


def _graph(tmp_path: Path, batch: int | str, reshape_to: int | None = None) -> str:
    """y = x + 1 for x [batch, 6] (``batch``: a number fixes it, a name leaves it open), optionally through a
    Reshape to a fixed [reshape_to, 6]: a graph that fixes its batch inside."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Add", ["x", "one"], ["y" if reshape_to is None else "z"])]
    inits = [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])]
    if reshape_to is not None:
        nodes.append(helper.make_node("Reshape", ["z", "shape"], ["y"]))
        inits.append(helper.make_tensor("shape", TensorProto.INT64, [2], [reshape_to, 6]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 6])], inits)
    path = tmp_path / f"g-{batch}-{reshape_to}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


@pytest.mark.parametrize("batch, reshape_to, expected", [("N", None, True), (4, None, False), ("N", 4, False)])
def test_a_partial_batch_runs_unpadded_only_where_the_graph_allows_it(tmp_path: Path, batch: int | str,
                                                                       reshape_to: int | None, expected: bool) -> None:
    """ONNX Runtime on a graph whose batch is open runs a partial batch as it is; a graph with a fixed batch, in
    its inputs or in a Reshape inside, gets its partial batches padded (the answers are the same either way)."""
    from dataclasses import replace

    from modak.image.runtimes.base import FunctionSession
    from modak.runtime import runs_partial_batches

    request = RunRequest(runtime="onnxruntime", device="cpu", precision="fp32", params={}, threads=1,
                         task="inference", onnx_path=_graph(tmp_path, batch, reshape_to), zoo=None, batch_size=4,
                         input_shapes={"x": [6]}, workdir=str(tmp_path))
    model = open_model(request)
    assert runs_partial_batches(model) is expected
    steps: list[int] = []

    def recording(feeds):
        steps.append(len(feeds["x"]))
        return model.session.run(feeds)

    recorded = replace(model, session=FunctionSession(recording), any_batch=runs_partial_batches(model))
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    assert np.array_equal(recorded.run({"x": x})["y"], x + 1)
    assert steps == ([4, 1] if expected else [4, 4])
