"""A request whose text makes the model raise fails alone: the requests that shared its model
batch are retried without it and get their exact scores."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from api_fakes import MultiOverlapReranker, OverlapReranker, config_for, overlap

from cisrank.api.app import create_app
from cisrank.serving.batching import BatchScorer, ScoringFailed
from cisrank.serving.config import BatchingConfig

POISON = "\u2620POISON\u2620"  # valid text that passes every edge check; only the fake rejects it


def _docs(i: int) -> list[str]:
    return [f"request {i} about hamlet", f"request {i} about the sea and ships", f"plain {i}"]


def test_the_batcher_retries_a_failed_batch_request_by_request():
    """Unit level: one model batch of 3 requests fails; each is retried alone, so the two good
    ones get their scores and only the poisoned one gets the error, marked as an input error."""
    reranker = MultiOverlapReranker()
    reranker.gate = threading.Event()
    reranker.poison = POISON
    scorer = BatchScorer(reranker, "r", BatchingConfig(max_wait_ms=0))

    async def run():
        blocker = asyncio.create_task(scorer.score("block", ["x"]))
        while not reranker.started.is_set():
            await asyncio.sleep(0.005)
        tasks = [
            asyncio.create_task(scorer.score("q1", ["a q1", "b"])),
            asyncio.create_task(scorer.score("q2", ["c", POISON])),
            asyncio.create_task(scorer.score("q3", ["q3 d"])),
        ]
        while scorer.depth < 4:
            await asyncio.sleep(0.005)
        reranker.gate.set()
        out = await asyncio.gather(blocker, *tasks, return_exceptions=True)
        await scorer.aclose()
        return out

    _, first, poisoned, third = asyncio.run(run())
    assert first == [overlap("q1", "a q1"), overlap("q1", "b")]
    assert third == [overlap("q3", "q3 d")]
    assert isinstance(poisoned, ScoringFailed)
    assert poisoned.input_error and isinstance(poisoned.__cause__, ValueError)
    # the coalesced batch (all three) failed once, then each request was scored on its own
    assert [len(b) for b in reranker.batches] == [1, 3, 1, 1, 1]


def test_a_server_fault_alone_is_not_an_input_error():
    reranker = OverlapReranker()
    reranker.fail_on = "explode"  # RuntimeError: a model bug, not the client's text
    scorer = BatchScorer(reranker, "r", BatchingConfig(max_wait_ms=0))

    async def run():
        try:
            await scorer.score("explode", ["a"])
        finally:
            await scorer.aclose()

    with pytest.raises(ScoringFailed) as info:
        asyncio.run(run())
    assert not info.value.input_error


def test_a_poisoned_request_fails_alone_among_ten_concurrent_ones_over_http(live_server):
    """Through uvicorn: 10 valid requests and 1 whose document makes the model raise are held
    behind a running model call, so they are coalesced into one model batch; that batch fails.
    Before the fix all 11 got 500; now the 10 get 200 with the scores they get alone, and the
    poisoned one alone gets 422 naming `documents`."""
    reranker = MultiOverlapReranker()
    reranker.gate = threading.Event()
    reranker.poison = POISON
    # (the gated call looks slow: no time bound on slices, or the 11 would not share one)
    batching = BatchingConfig(max_wait_ms=0, max_batch_passages=256, max_slice_s=600)
    cfg = config_for(["ov"], batching=batching)
    app = create_app(cfg, rerankers={"ov": reranker}, api_keys=[])
    url = live_server(app)
    scorer = app.state.serving.scorers["ov"]

    def post(query: str, documents: list[str]) -> httpx.Response:
        body = {"query": query, "documents": documents}
        return httpx.post(url + "/v1/rerank", json=body, timeout=30)

    with ThreadPoolExecutor(12) as pool:
        blocker = pool.submit(post, "block", ["x"])
        deadline = time.monotonic() + 10
        while not reranker.started.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)
        valid = [pool.submit(post, f"request {i} hamlet", _docs(i)) for i in range(10)]
        poisoned = pool.submit(post, "request 99 hamlet", ["fine text", f"bad {POISON} text"])
        while scorer.depth < 12 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert scorer.depth == 12, "the 11 requests did not all queue behind the blocker"
        reranker.gate.set()
        answers = [f.result() for f in valid]
        bad = poisoned.result()
        assert blocker.result().status_code == 200

    # the 11 requests did share one model batch, and it failed
    assert any(len(b) == 11 for b in reranker.batches)
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        got = {r["index"]: r["relevance_score"] for r in answer.json()["results"]}
        want = [overlap(f"request {i} hamlet", d) for d in _docs(i)]
        assert [got[j] for j in range(3)] == want
    assert bad.status_code == 422, bad.text
    body = bad.json()
    assert body["fields"][0]["field"] == "documents"
    assert "ValueError" in body["message"]
    # the server still answers on the same footing afterwards
    assert post("after", ["after text"]).status_code == 200


class _Batches:
    """A batch observer that records (passages, requests) of every model call."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def observe_batch(self, reranker, passages, requests, seconds) -> None:
        self.seen.append((passages, requests))

    def set_queue_depth(self, reranker, depth) -> None:
        pass


def test_a_real_tokenizer_error_fails_only_its_request(tiny_dense):
    """With a real model (tiny BERT, HF fast tokenizer): a lone surrogate, sent past the HTTP
    edge straight to the batcher, makes the tokenizer raise TypeError for the whole coalesced
    batch; the five valid requests get exactly their scores alone, the culprit an input error."""
    observer = _Batches()
    scorer = BatchScorer(tiny_dense, "d", BatchingConfig(max_wait_ms=200), observer)
    queries = [f"who wrote hamlet {i}" for i in range(5)]
    docs = ["shakespeare wrote hamlet", "paris is in france", "the sea"]

    async def run():
        tasks = [asyncio.create_task(scorer.score(q, docs)) for q in queries]
        tasks.insert(2, asyncio.create_task(scorer.score("who wrote hamlet", ["ok", "a\ud800"])))
        out = await asyncio.gather(*tasks, return_exceptions=True)
        await scorer.aclose()
        return out

    out = asyncio.run(run())
    assert observer.seen[0] == (3 * 5 + 2, 6)  # one coalesced model batch of the six requests
    culprit = out.pop(2)
    assert isinstance(culprit, ScoringFailed) and culprit.input_error
    assert [tiny_dense.score(q, docs) for q in queries] == out
