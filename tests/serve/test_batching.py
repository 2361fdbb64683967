"""The batcher: the model is built and run on one thread of its own, and jobs share a pass within the token budget."""

from __future__ import annotations

import asyncio
import threading

import pytest

from unmask.errors import UsageError
from unmask.serve.batching import Batcher, Job


class RecordingModel:
    """Records the thread that built it and each call's inputs and thread; answers each input with its length.
    A call waits for `release`, so jobs can be queued behind a pass in progress."""

    def __init__(self):
        self.built_on = threading.get_ident()
        self.calls: list[tuple[int, list]] = []
        self.entered, self.release = threading.Event(), threading.Event()

    def run(self, kind: str, inputs: list, options: tuple) -> list:
        self.entered.set()
        self.release.wait(timeout=30)
        self.calls.append((threading.get_ident(), list(inputs)))
        return [len(x) for x in inputs]


async def submit_all(batcher: Batcher, jobs: list[Job]) -> list:
    """Hold the worker in a pass of its own, queue `jobs` behind it, then let it go: what the worker takes next
    is decided by the queue alone, not by how fast the jobs arrived."""
    model = batcher.model
    holding = asyncio.create_task(batcher.submit(Job("hold", ["h"], 1)))
    while not model.entered.is_set():
        await asyncio.sleep(0.001)
    tasks = [asyncio.create_task(batcher.submit(job)) for job in jobs]
    while batcher.queue_size() < len(jobs):
        await asyncio.sleep(0)
    model.release.set()
    await holding
    return await asyncio.gather(*tasks)


def test_the_model_is_built_and_run_on_the_batchers_own_thread():
    batcher = Batcher(RecordingModel, max_batch_tokens=100)
    try:
        answers = asyncio.run(submit_all(batcher, [Job("embed", ["ab", "c"], 3), Job("embed", ["defg"], 4)]))
    finally:
        batcher.close(timeout=30)
    assert answers == [[2, 1], [4]]
    model = batcher.model
    assert model.built_on != threading.get_ident()
    assert {thread for thread, _ in model.calls} == {model.built_on}


def test_jobs_share_a_pass_within_the_token_budget_and_keep_their_order():
    batcher = Batcher(RecordingModel, max_batch_tokens=10)
    jobs = [Job("embed", [f"x{i}"], 4) for i in range(5)] + [Job("predict", ["p"], 1)]
    try:
        answers = asyncio.run(submit_all(batcher, jobs))
    finally:
        batcher.close(timeout=30)
    assert answers == [[2]] * 5 + [[1]]
    passes = [inputs for _, inputs in batcher.model.calls[1:]]  # after the holding pass
    assert all(sum(4 for x in p if x.startswith("x")) <= 10 for p in passes)  # never over the budget
    assert [x for p in passes for x in p if x.startswith("x")] == [f"x{i}" for i in range(5)]
    assert ["p"] in passes  # another kind never shares a pass


def test_a_loading_error_is_raised_by_the_constructor():
    def broken():
        raise UsageError("not a model directory")

    with pytest.raises(UsageError, match="not a model directory"):
        Batcher(broken, max_batch_tokens=10)
    with pytest.raises(UsageError, match="at least 1"):
        Batcher(RecordingModel, max_batch_tokens=0)
