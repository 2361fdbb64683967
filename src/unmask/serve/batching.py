"""Dynamic batching: requests queue up while the model is busy, and the next forward pass takes as many of them as
fit a token budget.

An encoder answers in one forward pass, so a server's throughput is set by how many inputs share it. Each request
becomes a `Job` (its inputs, already validated and counted in real tokens); one worker thread takes the oldest job,
adds the following jobs of the same kind in arrival order while the sum of their tokens stays within
`max_batch_tokens` (real tokens: the models run unpadded, so padding costs nothing to count), runs them as one call,
and hands each caller its own slice of the results. The event loop only waits on futures: it never runs the model.

The model is also built on that thread, so every torch operation of the server runs on one OS thread. Each thread
that runs a parallel operation gets its own OpenMP team, and once a process holds more team threads than cores,
OpenMP's workers sleep and wake on every operation instead of spinning: loading on the main thread and running on
another made the forward passes of a small model markedly slower (BENCHMARKS.md, issue 24).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from unmask.errors import UsageError


@dataclass
class Job:
    kind: str  # what to run: "embed", "predict", "rerank", "fill-mask", "tag"
    inputs: list  # (text or (query, document) pair, its encoding): tokenized once, before the queue
    tokens: int  # real tokens of all inputs
    options: tuple = ()  # settings that must be equal to share a forward pass (e.g. fill-mask's top_k)
    future: asyncio.Future | None = None
    loop: asyncio.AbstractEventLoop | None = None
    enqueued: float = field(default_factory=time.perf_counter)
    started: float = 0.0  # when its forward pass began
    finished: float = 0.0


@dataclass
class BatchStats:
    jobs: int
    inputs: int
    tokens: int
    queue_seconds: list[float]
    forward_seconds: float


class Batcher:
    """`load()` builds the model on the worker thread, and `model.run(kind, inputs, options) -> results` (one per
    input) is called there only. The constructor returns once the model is built (raising what `load` raised)."""

    def __init__(self, load: Callable[[], Any], max_batch_tokens: int,
                 on_batch: Callable[[BatchStats], None] = lambda stats: None):
        if max_batch_tokens < 1:
            raise UsageError(f"max_batch_tokens must be at least 1, got {max_batch_tokens}")
        self.max_batch_tokens, self.on_batch = max_batch_tokens, on_batch
        self._pending: deque[Job] = deque()
        self._wakeup = threading.Condition()
        self._closing = False
        loaded: Future = Future()
        self._worker = threading.Thread(target=self._work, args=(load, loaded), name="unmask-model", daemon=True)
        self._worker.start()
        self.model = loaded.result()

    def queue_size(self) -> int:
        return len(self._pending)

    async def submit(self, job: Job) -> list:
        job.loop = asyncio.get_running_loop()
        job.future = job.loop.create_future()
        with self._wakeup:
            if self._closing:
                raise RuntimeError("the server is shutting down")
            self._pending.append(job)
            self._wakeup.notify()
        return await job.future

    def close(self, timeout: float | None = None) -> None:
        """Finish the queued jobs, then stop the worker; after `timeout` seconds, stop waiting (the worker is a
        daemon thread: the process ends without it)."""
        with self._wakeup:
            self._closing = True
            self._wakeup.notify()
        self._worker.join(timeout)

    def _take(self) -> list[Job] | None:
        """The oldest job and the later ones of its kind that fit the budget with it (at least one job)."""
        with self._wakeup:
            while not self._pending:
                if self._closing:
                    return None
                self._wakeup.wait()
            first = self._pending.popleft()
            batch, tokens, rest = [first], first.tokens, deque()
            while self._pending:
                job = self._pending.popleft()
                same_kind = (job.kind, job.options) == (first.kind, first.options)
                if same_kind and tokens + job.tokens <= self.max_batch_tokens:
                    batch.append(job)
                    tokens += job.tokens
                else:
                    rest.append(job)
            self._pending = rest  # the others keep their order
            return batch

    def _work(self, load: Callable[[], Any], loaded: Future) -> None:
        try:
            model = load()
        except BaseException as e:  # noqa: BLE001 - raised by the constructor, on the caller's thread
            loaded.set_exception(e)
            return
        loaded.set_result(model)
        while (batch := self._take()) is not None:
            started = time.perf_counter()
            inputs = [x for job in batch for x in job.inputs]
            try:
                results, error = model.run(batch[0].kind, inputs, batch[0].options), None
            except Exception as e:  # noqa: BLE001 - handed to every caller of the batch
                results, error = None, e
            finished = time.perf_counter()
            elapsed, start = finished - started, 0
            for job in batch:
                job.started, job.finished = started, finished
                if error is None:
                    part = results[start : start + len(job.inputs)]
                    job.loop.call_soon_threadsafe(_resolve, job.future, part, None)
                else:
                    job.loop.call_soon_threadsafe(_resolve, job.future, None, error)
                start += len(job.inputs)
            self.on_batch(BatchStats(len(batch), len(inputs), sum(j.tokens for j in batch),
                                     [started - j.enqueued for j in batch], elapsed))


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():  # the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
