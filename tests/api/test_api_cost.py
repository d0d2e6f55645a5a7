"""Cost bounds and fair scheduling: a request costs the tokens of its (query, passage) pairs (UTF-8
bytes for these fakes, which declare no tokenizer; the model's own tokens are
`test_api_tokens.py`'s); one request over `max_request_cost` gets 422 naming `documents`, work over
a reranker's `max_inflight_cost` gets 503 + Retry-After, and a heavy request is scored in slices
bounded by tokens, interleaved with small requests, so a small request behind it waits about one
slice. Slowness is counted in model calls and tokens, never in wall time."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import httpx
from api_fakes import ListRetriever, MultiOverlapReranker, OverlapReranker, config_for, overlap

from cisrank.api.app import create_app
from cisrank.serving.batching import (
    BatchScorer,
    ScoringFailed,
    ScoringTimeout,
    byte_pair_tokens,
    pair_tokens,
)
from cisrank.serving.config import BatchingConfig, Limits

LONG = "lorem ipsum dolor sit amet " * 148  # 3,996 characters, as many bytes


def _tokens(batch) -> int:
    return sum(sum(byte_pair_tokens(q, ps)) for q, ps in batch)


def _heavy_then_small(max_batch_tokens: int):
    """A heavy request (1,000 long documents) is being scored when a 2-document request
    arrives: the model batches, in order (both requests' scores are checked here)."""
    reranker = MultiOverlapReranker()
    reranker.gate = threading.Event()
    reranker.seconds_per_char = 5e-8  # time proportional to work: 0.2 s for the heavy request
    cfg = BatchingConfig(
        max_batch_passages=256,
        max_batch_tokens=max_batch_tokens,
        max_wait_ms=0,
        max_inflight_cost=10**7,
    )
    scorer = BatchScorer(reranker, "r", cfg)
    heavy = [f"{i} {LONG}" for i in range(1000)]

    async def run():
        heavy_task = asyncio.create_task(scorer.score("heavy", heavy))
        while not reranker.started.is_set():  # the first slice of the heavy request is running
            await asyncio.sleep(0.002)
        small_task = asyncio.create_task(scorer.score("small", ["small a", "b"]))
        while scorer.depth < 2:
            await asyncio.sleep(0.002)
        reranker.gate.set()
        small = await small_task
        heavy_scores = await heavy_task
        await scorer.aclose()
        return small, heavy_scores

    small, heavy_scores = asyncio.run(run())
    assert small == [overlap("small", "small a"), overlap("small", "b")]
    assert heavy_scores == [overlap("heavy", p) for p in heavy]
    return reranker.batches


def test_a_small_request_behind_a_heavy_one_waits_one_token_bounded_slice():
    batches = _heavy_then_small(max_batch_tokens=32768)
    # every model call is bounded by tokens, not only by passages: 8 long documents a slice
    assert all(_tokens(b) <= 32768 for b in batches)
    assert len(batches) == 1000 // 8
    # the small request rode in the very next model call, ahead of the rest of the heavy one
    small_at = next(i for i, b in enumerate(batches) if any(q == "small" for q, _ in b))
    assert small_at == 1
    assert batches[1][0][0] == "small"
    # the model work done before the small request was answered: about one slice, not the
    # heavy request (1,000 x 4,000 tokens)
    assert sum(_tokens(b) for b in batches[: small_at + 1]) <= 2 * 32768
    # and the heavy request's slices are interleaved, all its passages scored once, in order
    heavy_rows = [p for b in batches for q, ps in b if q == "heavy" for p in ps]
    assert len(heavy_rows) == 1000 and heavy_rows[0].startswith("0 ")


def test_without_a_token_bound_the_small_request_waits_for_256_long_documents():
    """The control: slicing by passages alone (the old planner, `max_batch_tokens` unbounded)
    made the small request wait behind a model call of 256 x 4,000 tokens, 31x the bound above."""
    batches = _heavy_then_small(max_batch_tokens=10**9)
    small_at = next(i for i, b in enumerate(batches) if any(q == "small" for q, _ in b))
    assert small_at == 1
    assert sum(_tokens(b) for b in batches[:small_at]) > 1_000_000


def test_one_passage_over_the_token_bound_is_scored_alone():
    reranker = OverlapReranker()
    scorer = BatchScorer(reranker, "r", BatchingConfig(max_batch_tokens=10, max_wait_ms=0))

    async def run():
        try:
            return await scorer.score("q", ["q " * 50, "q", "q " * 40])
        finally:
            await scorer.aclose()

    assert asyncio.run(run()) == [overlap("q", p) for p in ["q " * 50, "q", "q " * 40]]
    assert [len(ps) for _, ps in reranker.calls] == [1, 1, 1]


def test_a_pair_costs_its_parts_capped_at_the_model_length():
    assert pair_tokens(3, [2, 1]) == [5, 4]
    assert pair_tokens(3, [4000], cap=512) == [512]
    # without counts, a text costs its UTF-8 bytes (at least 1): an upper bound of any
    # byte-level tokenizer's tokens, whatever the script
    assert byte_pair_tokens("abcd", ["x" * 8, ""]) == [4 + 8, 4 + 1]
    assert byte_pair_tokens("q", ["é", "中", "😀"]) == [1 + 2, 1 + 3, 1 + 4]
    assert byte_pair_tokens("abcd", ["x" * 4000], cap=512) == [512]


def test_a_request_over_max_request_cost_gets_422_naming_documents(make_client):
    client = make_client(
        {"ov": OverlapReranker()},
        limits=Limits(max_request_cost=8000),
        batching=BatchingConfig(max_inflight_cost=8000),
    )
    docs = ["word " * 400] * 5  # 5 x (4 + 2,000) = 10,020 bytes
    r = client.post("/v1/rerank", json={"query": "word", "documents": docs})
    assert r.status_code == 422, r.text
    assert r.json()["fields"][0]["field"] == "documents"
    assert "cost 10020 tokens" in r.json()["message"] and "8000" in r.json()["message"]
    # the same documents cut to 100 words each fit the budget (5 x (4 + 499))
    body = {"query": "word", "documents": docs, "max_tokens_per_doc": 100}
    assert client.post("/v1/rerank", json=body).status_code == 200


def test_a_reranked_search_over_max_request_cost_gets_422_naming_depth(make_client):
    corpus = {f"d{i}": f"hamlet {i} " + "text " * 100 for i in range(20)}
    client = make_client(
        {"ov": OverlapReranker()},
        retrievers={"c": ListRetriever(corpus)},
        limits=Limits(max_request_cost=4000),
        batching=BatchingConfig(max_inflight_cost=4000),
    )
    body = {"query": "hamlet", "rerank": "ov", "top_n": 3, "depth": 20}  # 20 x ~515 bytes
    r = client.post("/v1/search", json=body)
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "depth"
    assert client.post("/v1/search", json={**body, "depth": 5}).status_code == 200


def test_work_over_the_inflight_cost_budget_gets_503_with_retry_after():
    reranker = OverlapReranker()
    reranker.gate = threading.Event()
    cfg = config_for(
        ["ov"],
        limits=Limits(max_request_cost=4400),
        batching=BatchingConfig(max_inflight_cost=6000, max_wait_ms=0, retry_after_s=2),
    )
    app = create_app(cfg, rerankers={"ov": reranker}, api_keys=[])
    body = {"query": "q", "documents": ["word " * 400]}  # 1 + 2,000 bytes
    heavy = {"query": "q", "documents": ["word " * 400] * 2}  # 4,002

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://t") as c,
            app.router.lifespan_context(app),
        ):
            held = [asyncio.create_task(c.post("/v1/rerank", json=body)) for _ in range(2)]
            while app.state.serving.scorers["ov"].depth < 2:
                await asyncio.sleep(0.005)
            rejected = await c.post("/v1/rerank", json=heavy)  # 4,002 + 4,002 > 6,000
            # (the held requests are not scored yet: their 4,002 tokens are still in flight)
            reranker.gate.set()
            answered = await asyncio.gather(*held)
            after = await c.post("/v1/rerank", json=heavy)  # nothing in flight: admitted
            return rejected, answered, after

    rejected, answered, after = asyncio.run(run())
    assert rejected.status_code == 503, rejected.text
    assert rejected.headers["retry-after"] == "2"
    assert rejected.json()["error"] == "overloaded"
    assert "tokens of work queued" in rejected.json()["message"]
    assert [r.status_code for r in answered] == [200, 200]
    assert after.status_code == 200


def test_the_inflight_cost_is_given_back_on_success_failure_and_timeout():
    reranker = OverlapReranker()
    reranker.fail_on = "explode"
    scorer = BatchScorer(reranker, "r", BatchingConfig(max_wait_ms=0, max_inflight_cost=100))

    async def run():
        await scorer.score("q", ["a", "b"])
        with contextlib.suppress(ScoringFailed):
            await scorer.score("explode", ["a"])
        reranker.delay = 0.2
        with contextlib.suppress(ScoringTimeout):
            await scorer.score("q", ["a"], timeout=0.01)
        left = scorer.inflight_cost
        await scorer.aclose()
        return left

    assert asyncio.run(run()) == 0
