"""Auth on and off, Prometheus metrics (prior-store hit rate), /v1/search with an in-test index."""

from __future__ import annotations

import logging
import sys

import pytest
from api_fakes import FakePriorStore, ListRetriever, OverlapReranker, overlap

from cisrank.api.auth import KeyChecker, keys_from_env

BODY = {"query": "q", "documents": ["q"]}


LONG1, LONG2 = "k1-0123456789abcdef", "k2-0123456789abcdef"


def test_keys_from_env_and_checker():
    assert keys_from_env({"CISRANK_API_KEYS": f" {LONG1}, ,{LONG2} "}) == (LONG1, LONG2)
    assert keys_from_env({}) == ()
    assert keys_from_env({"CISRANK_API_KEYS": ""}) == ()  # compose's ${CISRANK_API_KEYS:-}
    checker = KeyChecker(["k1", "k2"])
    assert checker.allows("Bearer k2") and checker.allows("bearer k1")
    for header in (None, "", "Bearer", "Bearer k3", "Basic k1", "k1", "Bearer k1x"):
        assert not checker.allows(header), header
    assert KeyChecker([]).allows(None)
    assert "k1" not in repr(checker)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (" , ", "CISRANK_API_KEYS is set but holds no key"),
        (" ", "CISRANK_API_KEYS is set but holds no key"),
        (",,", "CISRANK_API_KEYS is set but holds no key"),
        (f"{LONG1},k2", "CISRANK_API_KEYS: key 2 of 2 has 2 characters, at least 16"),
        ("fifteen-chars-x", "CISRANK_API_KEYS: key 1 of 1 has 15 characters, at least 16"),
    ],
)
def test_a_key_variable_without_a_usable_key_fails_closed(value, says):
    """Before: `CISRANK_API_KEYS=" , "` started an open server, /v1/rerank and /metrics answered
    without a key, and nothing was said."""
    from cisrank.errors import CisrankError

    with pytest.raises(CisrankError) as raised:
        keys_from_env({"CISRANK_API_KEYS": value})
    assert str(raised.value).startswith(says)
    assert "fifteen" not in str(raised.value)  # a key is never shown


def test_serve_with_a_blank_key_variable_refuses_to_start_in_one_line(monkeypatch, capsys):
    from cisrank.cli.app import main

    def no_config(*args, **kwargs):
        raise AssertionError("the config was checked before the keys")

    monkeypatch.setattr("cisrank.cli.serve.server_config", no_config)
    monkeypatch.setenv("CISRANK_API_KEYS", " , ")
    monkeypatch.setattr(sys, "argv", ["cisrank", "serve", "--port", "0"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: CISRANK_API_KEYS is set but holds no key: set it to key1,key2 (each at least "
        "16 characters), or unset it to serve without keys"
    ]


def test_auth_on(make_client, caplog):
    caplog.set_level(logging.DEBUG)
    client = make_client({"ov": OverlapReranker()}, api_keys=["s3cret-key"])
    r = client.post("/v1/rerank", json=BODY)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["fields"][0]["field"] == "authorization"
    bad = client.post("/v1/rerank", json=BODY, headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401
    ok = client.post("/v1/rerank", json=BODY, headers={"Authorization": "Bearer s3cret-key"})
    assert ok.status_code == 200
    for path in ("/v1/models", "/metrics"):
        assert client.get(path).status_code == 401
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert "s3cret-key" not in caplog.text and "wrong" not in caplog.text


def test_auth_off(make_client):
    client = make_client({"ov": OverlapReranker()})
    assert client.post("/v1/rerank", json=BODY).status_code == 200
    assert client.post("/v1/rerank", json=BODY, headers={"Authorization": "x"}).status_code == 200


def _metric(text: str, name: str) -> float:
    """The value of the sample whose name-and-labels is exactly `name`."""
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name:
            return float(value)
    raise AssertionError(f"{name} not in metrics")


def test_metrics(make_client):
    cis = OverlapReranker("cis-model")
    cis.prior_store = FakePriorStore(hits=3, misses=1)
    plain = OverlapReranker()
    client = make_client({"cis": cis, "plain": plain})
    client.post("/v1/rerank", json={"query": "q", "documents": ["a", "b", "c"], "model": "cis"})
    client.post("/v1/rerank", json={"query": "", "documents": ["a"]})
    text = client.get("/metrics").text
    assert _metric(text, 'cisrank_prior_store_hit_rate{reranker="cis"}') == 0.75
    assert 'cisrank_prior_store_hit_rate{reranker="plain"}' not in text
    assert _metric(text, 'cisrank_requests_total{route="/v1/rerank",status="200"}') == 1
    assert _metric(text, 'cisrank_requests_total{route="/v1/rerank",status="422"}') == 1
    assert _metric(text, 'cisrank_batch_passages_sum{reranker="cis"}') == 3
    assert _metric(text, 'cisrank_batch_requests_count{reranker="cis"}') == 1
    assert _metric(text, 'cisrank_queue_depth{reranker="cis"}') == 0
    assert _metric(text, 'cisrank_request_latency_seconds_count{route="/v1/rerank"}') == 2


CORPUS = {
    "d1": "hamlet is a tragedy by shakespeare",
    "d2": "paris is the capital of france",
    "d3": "who wrote hamlet and when",
    "d4": "shakespeare wrote many plays",
}


@pytest.fixture
def search_client(make_client):
    reranker = OverlapReranker()
    # a reranker that inverts the first stage makes reranking visible in the order
    reranker.score = lambda q, ps: [-overlap(q, p) for p in ps]
    return make_client({"inv": reranker}, retrievers={"toy": ListRetriever(CORPUS)})


def test_search_first_stage_only(search_client):
    r = search_client.post("/v1/search", json={"query": "who wrote hamlet", "top_n": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["index"] == "toy" and body["model"] is None
    assert [(x["rank"], x["docid"]) for x in body["results"]] == [(1, "d3"), (2, "d1")]
    assert body["results"][0]["retrieval_score"] == pytest.approx(
        overlap("who wrote hamlet", CORPUS["d3"])
    )
    assert body["results"][0]["score"] == body["results"][0]["retrieval_score"]
    assert body["results"][0]["rerank_score"] is None


def test_search_reranked(search_client):
    q = "who wrote hamlet"
    r = search_client.post("/v1/search", json={"query": q, "top_n": 2, "rerank": "inv", "depth": 3})
    body = r.json()
    # first stage top-3: d3, d1, d4 (d4 ties d1 on words, shorter) -> inverted: lowest first
    first3 = sorted(CORPUS, key=lambda d: (-overlap(q, CORPUS[d]), d))[:3]
    expect = sorted(first3, key=lambda d: overlap(q, CORPUS[d]))[:2]
    assert [x["docid"] for x in body["results"]] == expect
    top = body["results"][0]
    assert top["rerank_score"] == pytest.approx(-overlap(q, CORPUS[expect[0]]))
    assert top["retrieval_score"] == pytest.approx(overlap(q, CORPUS[expect[0]]))
    assert body["model"] == "inv"


def test_search_reranks_a_long_passage_by_its_best_window(make_client):
    """A reranked search chunks as /v1/rerank does: a passage longer than the reranker's window
    is scored by its best window, said in `best_chunk` and the usage."""
    from cisrank.rerank.base import PassageWindow
    from cisrank.rerank.chunking import Chunking

    class Windowed(OverlapReranker):
        passage_window = PassageWindow(3, None)

    page = "nothing here at all, then who wrote hamlet"
    corpus = {"page": page, "short": "hamlet wrote"}
    client = make_client(
        {"w": Windowed()},
        retrievers={"toy": ListRetriever(corpus)},
        chunking=Chunking(overlap_tokens=0),
    )
    q = "who wrote hamlet"
    r = client.post("/v1/search", json={"query": q, "top_n": 2, "rerank": "w"})
    assert r.status_code == 200, r.text
    body = r.json()
    # the page's windows of 3 words: "nothing here at", "all, then who", "wrote hamlet"
    start = page.index("wrote hamlet")
    best = overlap(q, "wrote hamlet")
    top = body["results"][0]
    assert top["docid"] == "page" and top["rerank_score"] == pytest.approx(best)
    assert top["best_chunk"] == {"start": start, "end": len(page), "score": best, "text": None}
    assert body["results"][1]["best_chunk"] == {
        "start": 0, "end": len("hamlet wrote"), "score": overlap(q, "hamlet wrote"), "text": None
    }  # fmt: skip
    assert body["usage"] == {
        "documents": 2,
        "truncated_documents": 0,
        "chunked_documents": 1,
        "windows_scored": 4,
        "windows_dropped": 0,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": " "}, "query"),
        ({"query": "q", "top_n": 0}, "top_n"),
        ({"query": "q", "index": "nope"}, "index"),
        ({"query": "q", "rerank": "nope"}, "rerank"),
        ({"query": "q", "top_n": 5, "depth": 2}, "depth"),
        ({"query": "q", "top_n": 5000}, "top_n"),
    ],
)
def test_search_bad_input(search_client, body, field):
    r = search_client.post("/v1/search", json=body)
    assert r.status_code == 422, r.text
    assert field in [f["field"] for f in r.json()["fields"]]


def test_search_without_indexes_is_422(make_client):
    client = make_client({"ov": OverlapReranker()})
    r = client.post("/v1/search", json={"query": "q"})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "index"


def test_models_lists_rerankers_and_indexes(search_client):
    body = search_client.get("/v1/models").json()
    assert body["default"] == "inv"
    assert body["data"] == [
        {"id": "inv", "object": "model", "kind": "dense", "model": "model-inv", "ready": True}
        | {"runtime": None, "dtype": None}  # a stand-in model declares neither
    ]
    assert body["embeddings"] is None  # it has no bi-encoder
    assert body["indexes"] == [{"id": "toy", "kind": "list"}]


def test_search_on_a_real_bm25_index_opened_from_the_config(tmp_path):
    """The configured index is opened with cisrank.retrieval.open_index at startup."""
    import json

    from fastapi.testclient import TestClient

    from cisrank.api.app import create_app
    from cisrank.indexes.build import build_index
    from cisrank.indexes.kinds import open_index
    from cisrank.serving.config import IndexSpec, RerankerSpec, ServerConfig

    corpus = tmp_path / "corpus.jsonl"
    rows = {f"p{i}": t for i, t in enumerate(CORPUS.values())}
    corpus.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in rows.items()))
    build_index("bm25", corpus, tmp_path / "idx", progress=False)
    cfg = ServerConfig(
        rerankers={"ov": RerankerSpec(kind="api_fakes:slow_reranker", options={"delay": 0})},
        indexes={"bm25": IndexSpec(path=tmp_path / "idx")},
    )
    with TestClient(create_app(cfg, api_keys=[])) as client:
        serving = client.app.state.serving
        assert serving.wait_ready(30), serving.error
        body = client.post("/v1/search", json={"query": "who wrote hamlet", "top_n": 3}).json()
        direct = open_index(tmp_path / "idx").search("who wrote hamlet", 3)
        assert [(x["docid"], x["text"]) for x in body["results"]] == [
            (h.docid, h.text) for h in direct
        ]
        assert [x["retrieval_score"] for x in body["results"]] == pytest.approx(
            [h.score for h in direct]
        )
        r = client.post("/v1/search", json={"query": "hamlet", "top_n": 2, "rerank": "ov"})
        assert all(x["rerank_score"] == overlap("hamlet", x["text"]) for x in r.json()["results"])
