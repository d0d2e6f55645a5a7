"""POST /v1/rerank through the ASGI app: shape, order, scores equal to in-process scoring."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from api_fakes import MultiOverlapReranker, OverlapReranker, config_for, overlap

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.serving.config import BatchingConfig
from cisrank.serving.ranking import normalize_scores

DOCS = testing.SAMPLE_SENTENCES[:6]
QUERY = "who wrote hamlet"


def test_scores_equal_in_process_dense_scores(make_client, tiny_dense):
    client = make_client({"tiny": tiny_dense})
    expected = tiny_dense.score(QUERY, DOCS)
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "model", "results", "usage", "meta"}
    assert body["model"] == "tiny"
    assert body["usage"] == {
        "documents": 6,
        "truncated_documents": 0,
        "chunked_documents": 0,
        "windows_scored": 6,
        "windows_dropped": 0,
    }
    assert body["meta"]["billed_units"] == {"search_units": 1}
    got = {res["index"]: res["relevance_score"] for res in body["results"]}
    assert sorted(got) == list(range(6))
    for i, score in got.items():
        assert score == pytest.approx(expected[i], abs=1e-6)
    order = sorted(range(6), key=lambda i: -expected[i])
    assert [res["index"] for res in body["results"]] == order
    assert all("document" not in res for res in body["results"])


def test_top_n_return_documents_and_object_documents(make_client):
    client = make_client({"ov": OverlapReranker()})
    docs = ["hamlet is a play", {"text": "who wrote hamlet then", "id": "d2", "year": 1600}, "x"]
    r = client.post(
        "/v1/rerank",
        json={"query": QUERY, "documents": docs, "top_n": 2, "return_documents": True},
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    # overlap: doc1 shares who/wrote/hamlet (3 + 21/1000), doc0 shares hamlet (1 + 16/1000)
    assert results == [
        {
            "index": 1,
            "relevance_score": pytest.approx(3.021),
            "id": "d2",
            "document": {"text": "who wrote hamlet then", "id": "d2", "year": 1600},
            # a document that fits is its own one window, whole (its text is in `document`)
            "best_chunk": {"start": 0, "end": 21, "score": pytest.approx(3.021)},
        },
        {
            "index": 0,
            "relevance_score": pytest.approx(1.016),
            "document": {"text": "hamlet is a play"},
            "best_chunk": {"start": 0, "end": 16, "score": pytest.approx(1.016)},
        },
    ]
    # top_n larger than the list returns everything
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": docs, "top_n": 50})
    assert [x["index"] for x in r.json()["results"]] == [1, 0, 2]


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank", "/rerank"])
def test_alias_paths_and_model_choice(make_client, path):
    a, b = OverlapReranker("model-a"), OverlapReranker("model-b")
    client = make_client({"a": a, "b": b})
    r = client.post(path, json={"query": "q", "documents": ["q x"], "model": "b"})
    assert r.status_code == 200 and r.json()["model"] == "b"
    assert len(b.calls) == 1 and not a.calls
    # a model id in the config (not only the name) also selects the reranker
    r = client.post(path, json={"query": "q", "documents": ["q"], "model": "model-a"})
    assert r.json()["model"] == "a"
    # no model: the first configured one
    assert client.post(path, json={"query": "q", "documents": ["q"]}).json()["model"] == "a"


def test_normalization_is_opt_in():
    raw = [2.0, -1.0, 0.5]
    assert normalize_scores(raw, "none") == raw
    assert normalize_scores(raw, "minmax") == [1.0, 0.0, 0.5]
    assert normalize_scores(raw, "sigmoid") == pytest.approx([1 / (1 + math.exp(-s)) for s in raw])
    assert normalize_scores([-800.0], "sigmoid") == [0.0]  # no overflow


def test_normalize_field(make_client):
    client = make_client({"ov": OverlapReranker()})
    docs = ["hamlet", "nothing", "who wrote hamlet"]
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": docs, "normalize": "minmax"})
    scores = [x["relevance_score"] for x in r.json()["results"]]
    assert scores[0] == 1.0 and scores[-1] == 0.0


def test_max_tokens_per_doc_truncates_with_the_model_tokenizer(make_client, tiny_dense):
    client = make_client({"tiny": tiny_dense})
    doc = "Paris is the capital of France."
    r = client.post(
        "/v1/rerank",
        json={"query": "capital", "documents": [doc, "Hamlet"], "max_tokens_per_doc": 3},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["truncated_documents"] == 1
    # the word-level vocab makes each word one token: 3 tokens are "Paris is the"
    expected = tiny_dense.score("capital", ["Paris is the", "Hamlet"])
    got = {x["index"]: x["relevance_score"] for x in body["results"]}
    assert got[0] == pytest.approx(expected[0], abs=1e-6)
    assert got[1] == pytest.approx(expected[1], abs=1e-6)
    assert got[0] != pytest.approx(tiny_dense.score("capital", [doc])[0], abs=1e-6)


def test_max_tokens_per_doc_falls_back_to_words_without_a_tokenizer(make_client):
    reranker = OverlapReranker()
    client = make_client({"ov": reranker})
    r = client.post(
        "/v1/rerank",
        json={"query": "a", "documents": ["a  b c d", "e"], "max_tokens_per_doc": 2},
    )
    assert r.status_code == 200
    assert reranker.calls[-1] == ("a", ("a  b", "e"))


def _async_client(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def _post_concurrently(app, queries, docs) -> list[dict]:
    """One /v1/rerank request per (query, documents), all in flight at once; bodies in order."""

    async def run():
        async with _async_client(app) as c:
            rs = await asyncio.gather(
                *(
                    c.post("/v1/rerank", json={"query": q, "documents": d})
                    for q, d in zip(queries, docs, strict=True)
                )
            )
            return [r.json() for r in rs]

    return asyncio.run(run())


def test_concurrent_requests_get_their_own_results_dense(tiny_dense):
    app = create_app(config_for(["tiny"]), rerankers={"tiny": tiny_dense})
    queries = [f"{w} hamlet" for w in ("who", "when", "where", "paris", "fleas", "goldfish")]
    docs = [DOCS[i:] + DOCS[:i] for i in range(len(queries))]  # each request its own order

    bodies = _post_concurrently(app, queries, docs)
    for q, d, body in zip(queries, docs, bodies, strict=True):
        expected = tiny_dense.score(q, d)
        got = {x["index"]: x["relevance_score"] for x in body["results"]}
        assert [got[i] for i in range(len(d))] == pytest.approx(expected, abs=1e-6)


def test_concurrent_requests_share_one_model_batch():
    reranker = MultiOverlapReranker()
    cfg = config_for(["m"], batching=BatchingConfig(max_wait_ms=2000, max_batch_passages=6))
    app = create_app(cfg, rerankers={"m": reranker})
    queries = ["alpha one", "beta two", "gamma three"]
    docs = [["alpha", "one two"], ["two", "beta"], ["three", "x"]]

    bodies = _post_concurrently(app, queries, docs)
    # 6 passages fill the batch: one model call for all three requests, each gets its own scores
    assert len(reranker.batches) == 1
    assert sorted(reranker.batches[0]) == sorted(
        (q, tuple(d)) for q, d in zip(queries, docs, strict=True)
    )
    for q, d, body in zip(queries, docs, bodies, strict=True):
        got = {x["index"]: x["relevance_score"] for x in body["results"]}
        assert got == {i: pytest.approx(overlap(q, p)) for i, p in enumerate(d)}


def test_a_configured_cross_encoder_student_is_served(tiny_bert_dir, tmp_path):
    """The distilled student, named in the server config by kind and folder as a deployment
    would, loads at startup and serves raw logits equal to in-process scoring."""
    import time

    import torch
    from fastapi.testclient import TestClient
    from sentence_transformers import CrossEncoder

    from cisrank.rerank.registry import load_reranker
    from cisrank.serving.config import RerankerSpec, ServerConfig

    torch.manual_seed(0)
    student = CrossEncoder(str(tiny_bert_dir), num_labels=1)
    with torch.no_grad():
        student.model.classifier.weight.normal_(0.0, 1.0)  # scores spread well past 1e-5
    student.save_pretrained(str(tmp_path / "student"))
    spec = RerankerSpec(kind="cross-encoder", model=str(tmp_path / "student"))
    with TestClient(create_app(ServerConfig(rerankers={"student": spec}))) as client:
        deadline = time.monotonic() + 60
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, client.get("/readyz").text
            time.sleep(0.1)
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 3})
    assert r.status_code == 200, r.text
    expected = load_reranker("cross-encoder", str(tmp_path / "student")).score(QUERY, DOCS)
    got = [(res["index"], res["relevance_score"]) for res in r.json()["results"]]
    assert [i for i, _ in got] == sorted(range(6), key=lambda i: -expected[i])[:3]
    for i, score in got:
        assert score == pytest.approx(expected[i], abs=1e-5)
