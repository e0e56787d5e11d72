"""Dynamic batching for ``modak serve``: requests queue on the event loop and run, several at a time, as one
:meth:`~modak.runtime.Model.run` in a single worker thread (see :mod:`modak.runtime.serve`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from modak.runtime import Model
from modak.runtime.serve.metrics import Metrics
from modak.runtime.serve.protocol import ModelFailure, RequestError
from modak.runtime.serve.settings import Limits

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Pending:
    feeds: dict[str, np.ndarray]
    samples: int
    nbytes: int
    future: asyncio.Future[dict[str, np.ndarray]]
    arrival: float


@dataclass(eq=False)
class DynamicBatcher:
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
