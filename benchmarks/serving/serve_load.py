"""Load on ``modak serve``: the plan's tuned deployment vs the stock one, and dynamic batching on vs off.

Three servers run side by side from the same code, each started as the image starts it (the launcher, then
``modak serve``): ``tuned`` (the plan's choice, or ``--tuned NAME``), ``stock`` (ONNX Runtime with its default
options and all threads; ``--stock plan``: the plan's stock candidate, PyTorch eager) and ``unbatched`` (the tuned
deployment with ``--max-batch 1``); ``--compare-delay-ms MS`` adds ``delayed``, the tuned deployment whose batcher
waits up to MS for a fuller batch, beside the default that waits for nothing. At each concurrency, closed-loop
clients (one thread and one ``tritonclient.http`` client each, binary tensors, ``--samples`` samples per request)
load one server for ``--duration`` seconds, the servers taking turns round after round (tuned, stock, unbatched,
tuned, ...) so that machine noise hits all alike. The table gives requests/s, samples/s and p50/p99 latency over all
rounds, then the ratios tuned/stock and batching on/off. Client and servers share the machine: run it on a quiet one.

    python -m benchmarks.serving.serve_load examples/mnist-cnn-cpu/job.yaml [--batch 16] [--duration 10] [--rounds 3] \\
        [--concurrency 1 8 32]
    python -m benchmarks.serving.serve_load examples/mnist-cnn-cpu/job.yaml --duration 1 --rounds 1 \\
        --concurrency 1 8  # smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from modak import api
from modak.image.deployment import Deployment

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Server:
    """One ``modak serve`` subprocess."""

    label: str
    process: subprocess.Popen[str]
    url: str
    log: list[str] = field(default_factory=list)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def start(label: str, deployment: Deployment, onnx_path: Path, folder: Path, *options: str) -> Server:
    """``modak serve`` for ``deployment`` on a free loopback port, once its model is loaded."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps({"job": label, "deployment": deployment.to_dict()}))
    env = {**os.environ, "MODAK_PLAN": str(folder / "plan.json"), "MODAK_MODEL": str(onnx_path),
           "MODAK_WORKDIR": str(folder), "PYTHONPATH": str(ROOT)}
    command = (["modak.runtime", "serve"] if importlib.util.find_spec("modak.runtime.batch")
               else ["modak.runtime.serve"])
    process = subprocess.Popen(
        [sys.executable, "-m", "modak.image.launch", "--", sys.executable, "-m", *command, "--host", "127.0.0.1",
         "--port", "0", "--model-name", "model", *options],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr or ()], daemon=True).start()
    server = Server(label, process, "")
    deadline = time.monotonic() + 600  # compiling runtimes (TVM) take a while
    while not server.url:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{label}: the server did not start:\n{''.join(server.log)}") from None
            continue
        server.log.append(line)
        if line.startswith("modak serve:") and "http://" in line:
            server.url = f"127.0.0.1:{int(line.rsplit(':', 1)[1].split('/')[0])}"
    return server


def inputs(deployment: Deployment, metadata: dict, samples: int, seed: int = 0) -> dict[str, tuple[np.ndarray, str]]:
    """Random inputs of ``samples`` samples for the served model (integer ids below 100)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in metadata["inputs"]:
        shape = [samples, *deployment.input_shapes[spec["name"]]]
        if spec["datatype"].startswith(("INT", "UINT")):
            array = rng.integers(0, 100, shape)
        else:
            array = rng.standard_normal(shape)
        feeds[spec["name"]] = (array.astype({"FP32": np.float32, "FP16": np.float16, "FP64": np.float64,
                                             "INT64": np.int64, "INT32": np.int32}.get(spec["datatype"],
                                                                                      np.float32)),
                               spec["datatype"])
    return feeds


def infer(client, feeds: dict[str, tuple[np.ndarray, str]]):
    import tritonclient.http as triton

    given = []
    for name, (array, datatype) in feeds.items():
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        given.append(tensor)
    return client.infer("model", given)


@dataclass
class Tally:
    """Latencies (seconds) and errors of one server at one concurrency, over all its rounds."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0


def load(server: Server, feeds: dict[str, tuple[np.ndarray, str]], concurrency: int, duration: float,
         tally: Tally) -> None:
    """``concurrency`` closed-loop clients on ``server`` for ``duration`` seconds."""
    import tritonclient.http as triton

    clients = [triton.InferenceServerClient(server.url, network_timeout=120) for _ in range(concurrency)]
    barrier = threading.Barrier(concurrency + 1)
    results: list[tuple[list[float], int]] = []
    stop_at = [0.0]

    def worker(client) -> None:
        latencies, errors = [], 0
        barrier.wait()
        while time.perf_counter() < stop_at[0]:
            start = time.perf_counter()
            try:
                infer(client, feeds)
                latencies.append(time.perf_counter() - start)
            except Exception:
                errors += 1
        results.append((latencies, errors))

    threads = [threading.Thread(target=worker, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    stop_at[0] = time.perf_counter() + duration
    began = time.perf_counter()
    barrier.wait()
    for thread in threads:
        thread.join()
    tally.seconds += time.perf_counter() - began
    for latencies, errors in results:
        tally.latencies.extend(latencies)
        tally.errors += errors
    for client in clients:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", type=Path, help="job file (examples/mnist-cnn-cpu/job.yaml)")
    parser.add_argument("--target", type=Path, help="target file (default: the job's)")
    parser.add_argument("--tuned", help="a ranked candidate's name instead of the plan's choice (see `modak plan`)")
    parser.add_argument("--stock", choices=["onnxruntime", "plan"], default="onnxruntime",
                        help="onnxruntime: ONNX Runtime defaults, all threads (default); plan: the plan's stock")
    parser.add_argument("--batch", type=int, help="the deployments' batch size (default: the job's)")
    parser.add_argument("--samples", type=int, default=1, help="samples per request (1)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per server per round (10)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="--max-queue-delay-ms of the batching servers")
    parser.add_argument("--compare-delay-ms", type=float,
                        help="add a fourth server: the tuned deployment with this --max-queue-delay-ms")
    args = parser.parse_args()

    plan = api.plan_job(args.job, args.target)
    candidate = plan.choice.candidate
    if args.tuned:
        candidate = next((r.candidate for r in plan.ranked if r.candidate.name == args.tuned), None)
        if candidate is None:
            parser.error(f"--tuned: no ranked candidate named {args.tuned!r}")
    tuned = plan.deployment(candidate)
    if args.stock == "plan":
        if plan.stock is None:
            parser.error("the plan has no stock candidate")
        stock = plan.deployment(plan.stock.candidate)
    else:
        stock = replace(tuned, runtime="onnxruntime", precision="fp32", params={"threads": "all"}, env={})
    if args.batch:
        tuned, stock = replace(tuned, batch_size=args.batch), replace(stock, batch_size=args.batch)
    queue_size = str(max(64, 2 * max(args.concurrency)))
    print(f"tuned: {candidate.name} (batch {tuned.batch_size})\nstock: {stock.runtime}/{stock.precision} "
          f"{stock.params} (batch {stock.batch_size})\n{args.samples} sample(s) per request, {args.rounds} round(s) "
          f"of {args.duration:g} s per server and concurrency", flush=True)

    servers: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="modak-serve-load-") as scratch:
        try:
            batching = ["--max-queue-delay-ms", str(args.delay_ms)]
            setups = [("tuned", tuned, batching), ("stock", stock, batching),
                      ("unbatched", tuned, ["--max-batch", "1"])]
            if args.compare_delay_ms is not None:
                setups.append(("delayed", tuned, ["--max-queue-delay-ms", str(args.compare_delay_ms)]))
            for label, deployment, options in setups:
                servers.append(start(label, deployment, plan.source.onnx_path, Path(scratch) / label, *options,
                                     "--max-queue", queue_size))
            import tritonclient.http as triton

            probe = triton.InferenceServerClient(servers[0].url)
            feeds = inputs(tuned, probe.get_model_metadata("model"), args.samples)
            answers = {}
            for server in servers:  # one request each: the same answers?
                client = triton.InferenceServerClient(server.url)
                answers[server.label] = infer(client, feeds)
                client.close()
            outputs = [o["name"] for o in probe.get_model_metadata("model")["outputs"]]
            probe.close()
            for label, answer in answers.items():
                for name in outputs:
                    reference, got = answers["tuned"].as_numpy(name), answer.as_numpy(name)
                    scale = max(float(np.max(np.abs(reference))), 1e-6)
                    if float(np.max(np.abs(got - reference))) / scale > 1e-2:
                        print(f"warning: {label}'s {name} differs from tuned's", flush=True)
            for server in servers:  # warm-up under load: thread pools, allocator, batch shapes
                load(server, feeds, max(args.concurrency), min(args.duration, 2.0), Tally())
            tallies = {(s.label, c): Tally() for s in servers for c in args.concurrency}
            for concurrency in args.concurrency:
                for _ in range(args.rounds):
                    for server in servers:
                        load(server, feeds, concurrency, args.duration, tallies[server.label, concurrency])
                        time.sleep(0.2)
            report(tallies, args.concurrency, args.samples)
        finally:
            codes = {s.label: s.stop() for s in servers}
    bad = {label: code for label, code in codes.items() if code != 0}
    if bad:
        print(f"servers that did not exit 0 after SIGTERM: {bad}")
    return 1 if bad else 0


def report(tallies: dict[tuple[str, int], Tally], concurrencies: list[int], samples: int) -> None:
    def stats(tally: Tally) -> tuple[float, float, float]:
        times = np.asarray(tally.latencies) * 1e3
        if not len(times):
            return 0.0, float("nan"), float("nan")
        return len(times) / tally.seconds, float(np.percentile(times, 50)), float(np.percentile(times, 99))

    print(f"\n{'concurrency':>11} {'server':<10} {'req/s':>9} {'samples/s':>10} {'p50 ms':>9} {'p99 ms':>9} "
          f"{'errors':>7}")
    labels = list(dict.fromkeys(label for label, _ in tallies))
    for concurrency in concurrencies:
        for label in labels:
            tally = tallies[label, concurrency]
            rate, p50, p99 = stats(tally)
            print(f"{concurrency:>11} {label:<10} {rate:9.1f} {rate * samples:10.1f} {p50:9.2f} {p99:9.2f} "
                  f"{tally.errors:>7}")
    print(f"\n{'concurrency':>11} {'tuned/stock req/s':>18} {'stock/tuned p50':>16} {'batching on/off req/s':>22} "
          f"{'off/on p99':>11}")
    for concurrency in concurrencies:
        (tuned, t50, t99), (stock, s50, _), (unbatched, _, u99) = (
            stats(tallies[label, concurrency]) for label in ("tuned", "stock", "unbatched"))
        print(f"{concurrency:>11} {tuned / stock if stock else float('nan'):17.2f}x {s50 / t50:15.2f}x "
              f"{tuned / unbatched if unbatched else float('nan'):21.2f}x {u99 / t99:10.2f}x")
    if "delayed" in labels:
        print(f"\n{'concurrency':>11} {'not waiting/waiting req/s':>26} {'waiting/not p50':>16} "
              f"{'waiting/not p99':>16}")
        for concurrency in concurrencies:
            (tuned, t50, t99), (delayed, d50, d99) = (stats(tallies[label, concurrency])
                                                      for label in ("tuned", "delayed"))
            print(f"{concurrency:>11} {tuned / delayed if delayed else float('nan'):25.2f}x {d50 / t50:15.2f}x "
                  f"{d99 / t99:15.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
