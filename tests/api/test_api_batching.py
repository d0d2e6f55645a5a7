"""The batcher alone: chunking, shortest-remaining-first, no stall behind a large request."""

from __future__ import annotations

import asyncio
import threading

import pytest
from api_fakes import OverlapReranker, overlap

from cisrank.serving.batching import BatchScorer, QueueFullError
from cisrank.serving.config import BatchingConfig


def test_large_request_is_chunked_and_scores_match():
    reranker = OverlapReranker()
    scorer = BatchScorer(reranker, "r", BatchingConfig(max_batch_passages=4, max_wait_ms=0))
    passages = [f"p{i} q" if i % 3 else f"p{i}" for i in range(10)]

    async def run():
        try:
            return await scorer.score("q", passages)
        finally:
            await scorer.aclose()

    scores = asyncio.run(run())
    assert scores == [overlap("q", p) for p in passages]
    assert [len(p) for _, p in reranker.calls] == [4, 4, 2]


def test_small_request_does_not_wait_for_a_large_one():
    reranker = OverlapReranker()
    reranker.gate = threading.Event()
    scorer = BatchScorer(reranker, "r", BatchingConfig(max_batch_passages=4, max_wait_ms=0))
    big = [f"big{i}" for i in range(20)]

    async def run():
        big_task = asyncio.create_task(scorer.score("big", big))
        while not reranker.started.is_set():  # the first chunk of the large request is running
            await asyncio.sleep(0.005)
        small_task = asyncio.create_task(scorer.score("small", ["s1", "s2"]))
        await asyncio.sleep(0.05)
        reranker.gate.set()
        small = await small_task
        await big_task
        await scorer.aclose()
        return small

    small = asyncio.run(run())
    assert small == [overlap("small", "s1"), overlap("small", "s2")]
    # the small request rode in the very next batch (one large chunk of 4 was running):
    # shortest remaining first, then the large request fills the rest of the batch
    assert reranker.calls[1] == ("small", ("s1", "s2"))
    assert reranker.calls[2] == ("big", ("big4", "big5"))
    assert sum(len(p) for q, p in reranker.calls if q == "big") == 20


def test_queue_limit_and_closed_scorer():
    reranker = OverlapReranker()
    reranker.gate = threading.Event()
    scorer = BatchScorer(reranker, "r", BatchingConfig(max_queue=1, max_wait_ms=0))

    async def run():
        first = asyncio.create_task(scorer.score("q", ["a"]))
        while not reranker.started.is_set():
            await asyncio.sleep(0.005)
        with pytest.raises(QueueFullError):
            await scorer.score("q", ["b"])
        reranker.gate.set()
        await first
        await scorer.aclose()
        with pytest.raises(QueueFullError):
            await scorer.score("q", ["c"])
        return await scorer.score("q", [])

    assert asyncio.run(run()) == []


def test_a_large_request_is_not_starved_by_a_stream_of_small_ones():
    """Regression: shortest-remaining-first let a steady stream of small requests (each filling a
    whole batch) take every round, so a large request waited until the stream paused or its own
    timeout hit. Aging bounds that wait: every model call takes at least `delay` (2 ms), so a job
    starved for `max_age_ms` (20 ms) is planned first after at most 10 rounds of small requests,
    and the 3 chunks of the large one finish after at most 3 * (10 + 1) small calls."""
    reranker = OverlapReranker(delay=0.002)
    cfg = BatchingConfig(max_batch_passages=4, max_wait_ms=0, max_age_ms=20)
    scorer = BatchScorer(reranker, "r", cfg)
    big = [f"big{i} q" if i % 2 else f"big{i}" for i in range(12)]
    small = ["q a", "b", "q c", "d"]
    stream_limit = 300

    async def run():
        big_task = asyncio.create_task(scorer.score("big", big))
        answered = []

        async def stream():
            while not big_task.done() and len(answered) < stream_limit:
                answered.append(await scorer.score("q", small))

        await asyncio.gather(big_task, *(stream() for _ in range(3)))
        await scorer.aclose()
        return big_task.result(), answered

    big_scores, answered = asyncio.run(run())
    assert big_scores == [overlap("big", p) for p in big]
    assert all(scores == [overlap("q", p) for p in small] for scores in answered)
    last_big = max(i for i, (q, _) in enumerate(reranker.calls) if q == "big")
    assert [len(p) for q, p in reranker.calls if q == "big"] == [4, 4, 4]
    assert sum(q == "q" for q, _ in reranker.calls[:last_big]) <= 3 * (10 + 1)
