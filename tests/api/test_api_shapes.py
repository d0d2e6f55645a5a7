"""The shapes users bring: Hugging Face TEI's `POST /rerank` with `texts` (answered as TEI's list of
`{index, score, text?}`), and OpenAI's `POST /v1/embeddings` for a served dense reranker, through
the official `openai` client against a real uvicorn."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest
from api_fakes import OverlapReranker, config_for, overlap

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.serving.config import Limits

QUERY = "who wrote hamlet"
TEXTS = testing.SAMPLE_SENTENCES[:5]


def test_tei_rerank_answers_tei_s_list(make_client):
    client = make_client({"ov": OverlapReranker()})
    raw = [overlap(QUERY, t) for t in TEXTS]
    order = sorted(range(len(TEXTS)), key=lambda i: -raw[i])
    r = client.post("/rerank", json={"query": QUERY, "texts": TEXTS})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [x["index"] for x in out] == order
    assert [x["score"] for x in out] == pytest.approx([1 / (1 + math.exp(-raw[i])) for i in order])
    assert all(set(x) == {"index", "score"} for x in out)
    r = client.post(
        "/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": True, "return_text": True}
    )
    assert r.json() == [
        {"index": i, "score": pytest.approx(raw[i]), "text": TEXTS[i]} for i in order
    ]
    # the Cohere shape still answers on /rerank as on /v1/rerank
    cohere = client.post("/rerank", json={"query": QUERY, "documents": TEXTS}).json()
    assert [x["index"] for x in cohere["results"]] == order


def test_tei_rerank_is_bounded_like_rerank_and_names_texts(make_client):
    client = make_client({"ov": OverlapReranker()}, limits=Limits(max_documents=3))
    cases = [
        ({"texts": TEXTS}, "texts", "over the limit of 3"),
        ({"texts": ["a", "b" * 40_000]}, "texts.1", "over the limit of 32768"),
        ({"texts": []}, "texts", "at least 1"),
        ({"texts": ["a"], "truncation_direction": "left"}, "truncation_direction", "right"),
        ({"texts": ["a"], "model": "nope"}, "model", "not served here"),
    ]
    for change, field, message in cases:
        r = client.post("/rerank", json={"query": QUERY, **change})
        assert r.status_code == 422, (change, r.text)
        assert r.json()["fields"][0]["field"] == field, (change, r.text)
        assert message in r.text, (change, r.text)


@pytest.fixture
def served(live_server, tiny_dense):
    app = create_app(
        config_for(["dense", "ov"], limits=Limits(max_documents=8, max_request_cost=400)),
        rerankers={"dense": tiny_dense, "ov": OverlapReranker()},
        api_keys=[],
    )
    return live_server(app)


def test_openai_embeddings_through_the_official_client(served, tiny_dense):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0)
    want = tiny_dense.embed(TEXTS)
    # the client asks for base64 by default and decodes it
    got = client.embeddings.create(model="dense", input=TEXTS)
    assert [d.index for d in got.data] == list(range(5))
    assert np.allclose(np.array([d.embedding for d in got.data]), want, atol=1e-6)
    tokenizer = tiny_dense.fast_tokenizer
    tokens = sum(len(ids) for ids in tokenizer(TEXTS)["input_ids"])
    assert got.usage.prompt_tokens == got.usage.total_tokens == tokens
    assert got.model == "dense"
    one = client.embeddings.create(model="dense", input=TEXTS[0], encoding_format="float")
    assert len(one.data) == 1
    assert np.allclose(one.data[0].embedding, want[0], atol=1e-6)
    assert math.isclose(float(np.linalg.norm(one.data[0].embedding)), 1.0, rel_tol=1e-5)


def test_embeddings_as_raw_json_and_their_bounds(served, tiny_dense):
    import httpx

    url = served + "/v1/embeddings"
    r = httpx.post(url, json={"input": TEXTS[:2], "encoding_format": "base64"}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "dense"
    first = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(first, tiny_dense.embed(TEXTS[:1])[0], atol=1e-6)
    assert body["data"][0]["object"] == "embedding"
    dim = first.size
    cases = [
        ({"input": "x", "model": "ov"}, "model", "no bi-encoder"),
        ({"input": ["a"] * 9}, "input", "over the limit of 8"),
        ({"input": ["a", " "]}, "input.1", "empty"),
        ({"input": []}, "input", "at least one text"),
        ({"input": ["word " * 400] * 5}, "input", "over the limit of 400"),
        ({"input": [1, 2]}, "input", "valid string"),
        ({"input": "x", "dimensions": dim + 1}, "dimensions", f"have {dim} dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format", "base64"),
    ]
    for change, field, message in cases:
        r = httpx.post(url, json=change, timeout=30)
        assert r.status_code == 422, (change, r.text)
        assert r.json()["fields"][0]["field"].startswith(field), (change, r.text)
        assert message in r.text, (change, r.text)
    assert httpx.post(url, json={"input": "x", "dimensions": dim}, timeout=30).status_code == 200


def test_tei_scores_of_a_dense_reranker_are_its_cosines_not_their_sigmoid(make_client, tiny_dense):
    """TEI's `raw_scores: false` (its default) is the sigmoid of a classifier's logit; on a dense
    reranker it put every positive cosine above 0.5. A cosine is not a logit: it is answered as is,
    with or without `raw_scores`, and equals `/v1/rerank`."""
    client = make_client({"dense": tiny_dense, "ov": OverlapReranker()})
    cosines = tiny_dense.score(QUERY, TEXTS)
    order = sorted(range(len(TEXTS)), key=lambda i: -cosines[i])
    for extra in ({}, {"raw_scores": False}, {"raw_scores": True}):
        r = client.post("/rerank", json={"query": QUERY, "texts": TEXTS, "model": "dense", **extra})
        assert r.status_code == 200, r.text
        assert [x["index"] for x in r.json()] == order
        assert [x["score"] for x in r.json()] == pytest.approx(
            [cosines[i] for i in order], abs=1e-6
        )
    # a logit still gets TEI's sigmoid
    raw = [overlap(QUERY, t) for t in TEXTS]
    ov = client.post("/rerank", json={"query": QUERY, "texts": TEXTS, "model": "ov"}).json()
    assert sorted(x["score"] for x in ov) == pytest.approx(
        sorted(1 / (1 + math.exp(-s)) for s in raw)
    )
