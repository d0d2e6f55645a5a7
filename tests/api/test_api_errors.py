"""Every bad input gets a 4xx with a JSON body naming the field; overload gets 503 + Retry-After."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from api_fakes import OverlapReranker, config_for

from cisrank.api.app import create_app
from cisrank.serving.config import BatchingConfig, Limits

LIMITS = Limits(max_documents=5, max_document_chars=50, max_query_chars=40, max_body_bytes=2048)


@pytest.fixture
def client(make_client):
    return make_client({"ov": OverlapReranker()}, limits=LIMITS)


def _fields(r) -> list[str]:
    return [f["field"] for f in r.json()["fields"]]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"query": "", "documents": ["a"]}, 422, "query"),
        ({"query": "  \t\n", "documents": ["a"]}, 422, "query"),
        ({"query": "q" * 41, "documents": ["a"]}, 422, "query"),
        ({"query": "q", "documents": []}, 422, "documents"),
        ({"query": "q", "documents": ["a"] * 6}, 422, "documents"),
        ({"query": "q", "documents": ["a", "b" * 51]}, 422, "documents.1"),
        ({"query": "q", "documents": ["a", {"text": "b" * 51}]}, 422, "documents.1.text"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, 422, "top_n"),
        ({"query": "q", "documents": ["a"], "top_n": -3}, 422, "top_n"),
        ({"query": "q", "documents": ["a"], "top_n": "many"}, 422, "top_n"),
        ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, 422, "max_tokens_per_doc"),
        ({"query": 5, "documents": ["a"]}, 422, "query"),
        ({"query": "q", "documents": "a"}, 422, "documents"),
        ({"query": "q", "documents": [7]}, 422, "documents.0"),
        ({"query": "q", "documents": [{"id": "x"}]}, 422, "documents.0.text"),
        (
            {"query": "q", "documents": ["a"], "return_documents": "perhaps"},
            422,
            "return_documents",
        ),
        ({"query": "q", "documents": ["a"], "model": "nope"}, 422, "model"),
        ({"query": "q", "documents": ["a"], "normalize": "softmax"}, 422, "normalize"),
        ({"documents": ["a"]}, 422, "query"),
        ([], 422, "body"),
        ("just a string", 422, "body"),
    ],
)
def test_bad_rerank_input_names_the_field(client, body, status, field):
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == status, r.text
    payload = r.json()
    assert payload["error"] == "invalid_request"
    assert field in _fields(r), payload
    assert field in payload["message"]


@pytest.mark.parametrize("raw", [b"{", b'{"query": "q", "documents": ["a"]', b"\xff\xfe", b"nul"])
def test_malformed_json_is_400(client, raw):
    r = client.post("/v1/rerank", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert _fields(r) == ["body"]


def test_body_over_the_byte_limit_is_413(client):
    big = {"query": "q", "documents": ["a" * 40] * 60}  # about 2.6 kB > 2048
    r = client.post("/v1/rerank", json=big)
    assert r.status_code == 413
    assert _fields(r) == ["body"] and "2048" in r.json()["message"]


def test_chunked_body_over_the_limit_is_413(client):
    def gen():
        yield b'{"query": "q", "documents": ['
        for _ in range(100):
            yield b'"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",'
        yield b'"a"]}'

    r = client.post("/v1/rerank", content=gen(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_unknown_fields_are_ignored_for_client_compatibility(client):
    body = {"query": "q", "documents": ["q"], "rank_fields": ["text"], "max_chunks_per_doc": 3}
    assert client.post("/v1/rerank", json=body).status_code == 200


def test_unknown_path_and_method(client):
    assert client.get("/v1/nothing").status_code == 404
    assert client.get("/v1/rerank").status_code == 405


def _async_client(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def test_full_queue_answers_503_with_retry_after():
    reranker = OverlapReranker()
    reranker.gate = threading.Event()
    cfg = config_for(["ov"], batching=BatchingConfig(max_queue=2, max_wait_ms=0, retry_after_s=3))
    app = create_app(cfg, rerankers={"ov": reranker})
    body = {"query": "q", "documents": ["q"]}

    async def run():
        async with _async_client(app) as c:
            held = [asyncio.create_task(c.post("/v1/rerank", json=body)) for _ in range(2)]
            while not reranker.started.is_set():
                await asyncio.sleep(0.01)
            rejected = await c.post("/v1/rerank", json=body)
            reranker.gate.set()
            return rejected, await asyncio.gather(*held)

    rejected, held = asyncio.run(run())
    assert rejected.status_code == 503
    assert rejected.headers["retry-after"] == "3"
    assert rejected.json()["error"] == "overloaded"
    assert [r.status_code for r in held] == [200, 200]


def test_request_timeout_answers_503_and_the_worker_keeps_serving():
    reranker = OverlapReranker(delay=0.3)
    cfg = config_for(["ov"], batching=BatchingConfig(request_timeout_s=0.05, max_wait_ms=0))
    app = create_app(cfg, rerankers={"ov": reranker})

    async def run():
        async with _async_client(app) as c:
            first = await c.post("/v1/rerank", json={"query": "q", "documents": ["q"]})
            reranker.delay = 0
            app.state.serving.scorers["ov"].config = BatchingConfig(request_timeout_s=5)
            second = await c.post("/v1/rerank", json={"query": "q", "documents": ["q"]})
            return first, second

    first, second = asyncio.run(run())
    assert first.status_code == 503 and first.json()["error"] == "timeout"
    assert "retry-after" in first.headers
    assert second.status_code == 200


def test_a_failing_reranker_fails_only_its_request(make_client):
    reranker = OverlapReranker()
    reranker.fail_on = "explode"
    client = make_client({"ov": reranker})
    r = client.post("/v1/rerank", json={"query": "explode", "documents": ["a"]})
    assert r.status_code == 500 and r.json()["error"] == "internal_error"
    assert "boom" not in r.text  # internals stay in the log
    r = client.post("/v1/rerank", json={"query": "fine", "documents": ["fine"]})
    assert r.status_code == 200


def test_not_ready_while_loading_answers_503():
    from cisrank.serving.config import RerankerSpec, ServerConfig

    cfg = ServerConfig(rerankers={"x": RerankerSpec(kind="api_fakes:slow_reranker")})
    app = create_app(cfg)  # models load only when the lifespan starts: not yet
    from fastapi.testclient import TestClient

    client = TestClient(app)  # no context manager: no lifespan, so never loaded
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 503 and r.json()["error"] == "not_ready"
    assert r.headers["retry-after"] == "1"  # loading ends: worth retrying
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
    assert client.get("/healthz").json() == {"status": "ok", "detail": {}}
