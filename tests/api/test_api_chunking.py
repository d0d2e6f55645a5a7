"""Long and structured documents on /v1/rerank: every window costed before work, the cap said
in usage, the answer at a document's end found by max pooling and missed by first (the
truncation it was); records ranked by their `rank_fields`, a missing field named."""

from __future__ import annotations

import pytest
from api_fakes import OverlapReranker, overlap

from cisrank.rerank.base import PassageWindow
from cisrank.rerank.chunking import Chunking
from cisrank.rerank.fields import render_all
from cisrank.serving.config import Limits

QUERY = "who wrote hamlet"


class WindowedOverlap(OverlapReranker):
    """`OverlapReranker` whose model reads 4 words of a passage (no tokenizer: costs in bytes)."""

    passage_window = PassageWindow(4, None)


LONG = "word " * 40  # 200 bytes whole; 19 windows of 4 words (19 bytes) at overlap 2


def test_every_windows_cost_counts_in_the_budget_before_work(make_client):
    reranker = WindowedOverlap()
    client = make_client(
        {"w": reranker},
        limits=Limits(max_request_cost=300),
        chunking=Chunking(overlap_tokens=2),
    )
    # whole, (q, document) costs 1 + 200 = 201; as windows 19 x (1 + 19) = 380 > 300
    r = client.post("/v1/rerank", json={"query": "q", "documents": [LONG]})
    assert r.status_code == 422, r.text
    problem = r.json()["fields"][0]
    assert problem["field"] == "documents"
    assert "380 tokens" in problem["message"] and "(query, window)" in problem["message"]
    assert reranker.calls == []  # refused before any model work
    # capped at 5 windows: 5 x 20 = 100, admitted, the 14 others said in usage
    r = client.post("/v1/rerank", json={"query": "q", "documents": [LONG], "max_chunks_per_doc": 5})
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {
        "documents": 1,
        "truncated_documents": 0,
        "chunked_documents": 1,
        "windows_scored": 5,
        "windows_dropped": 14,
    }
    assert reranker.calls == [("q", ("word word word word",) * 5)]


ANSWER_LAST = "filler text about nothing much here and there then hamlet shakespeare wrote"
ANSWER_FIRST = "hamlet is a tragedy"


def test_an_answer_at_the_end_ranks_first_with_max_pooling_not_with_first(make_client):
    query = "who wrote hamlet shakespeare"
    documents = [ANSWER_FIRST, ANSWER_LAST]
    orders, chunks = {}, {}
    for pooling in ("max", "first"):
        client = make_client(
            {"w": WindowedOverlap()}, chunking=Chunking(overlap_tokens=0, pooling=pooling)
        )
        body = {"query": query, "documents": documents, "return_documents": True}
        r = client.post("/v1/rerank", json=body)
        assert r.status_code == 200, r.text
        orders[pooling] = [x["index"] for x in r.json()["results"]]
        chunks[pooling] = r.json()["results"][0]["best_chunk"]
    assert orders == {"max": [1, 0], "first": [0, 1]}
    last = "hamlet shakespeare wrote"  # the last window of 4 words: "then hamlet ..."
    start = ANSWER_LAST.index("then")
    assert chunks["max"] == {
        "start": start,
        "end": len(ANSWER_LAST),
        "score": overlap(query, "then " + last),
        "text": "then " + last,
    }


def test_rank_fields_rank_objects_and_json_strings_by_their_lines(make_client):
    reranker = OverlapReranker()
    client = make_client({"ov": reranker})
    documents = [
        {"id": "a", "title": "macbeth", "body": "who wrote hamlet", "year": 1606},
        '{"title": "hamlet", "body": "a play"}',
        {"title": "hamlet wrote who", "body": "x"},
    ]
    body = {"query": QUERY, "documents": documents, "rank_fields": ["title", "body"]}
    r = client.post("/v1/rerank", json={**body, "return_documents": True})
    assert r.status_code == 200, r.text
    lines = render_all(documents, ["title", "body"])
    assert lines[0] == "title: macbeth\nbody: who wrote hamlet"
    want = sorted(range(3), key=lambda i: (-overlap(QUERY, lines[i]), i))
    results = r.json()["results"]
    assert [x["index"] for x in results] == want
    assert [x["relevance_score"] for x in results] == [overlap(QUERY, lines[i]) for i in want]
    first = next(x for x in results if x["index"] == 0)
    assert first["id"] == "a" and first["document"] == {**documents[0], "id": "a"}
    assert reranker.calls[-1] == (QUERY, tuple(lines))


def test_rank_fields_a_missing_field_is_a_422_naming_the_document_and_field(make_client):
    client = make_client({"ov": OverlapReranker()})
    documents = [{"title": "a", "body": "b"}, {"title": "c"}]
    r = client.post(
        "/v1/rerank",
        json={"query": QUERY, "documents": documents, "rank_fields": ["title", "body"]},
    )
    assert r.status_code == 422, r.text
    assert r.json()["fields"][0]["field"] == "documents.1.body"
    # an object without text is ranked only by fields
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": [{"title": "a"}]})
    assert r.status_code == 422, r.text
    assert r.json()["fields"][0]["field"] == "documents.0.text"


def test_max_tokens_per_doc_cuts_before_the_windows(make_client):
    reranker = WindowedOverlap()
    client = make_client({"w": reranker}, chunking=Chunking(overlap_tokens=0))
    doc = "one two three four five six seven eight nine ten eleven twelve"
    body = {"query": "q", "documents": [doc], "max_tokens_per_doc": 6}
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    assert reranker.calls == [("q", ("one two three four", "five six"))]
    assert r.json()["usage"] == {
        "documents": 1,
        "truncated_documents": 1,
        "chunked_documents": 1,
        "windows_scored": 2,
        "windows_dropped": 0,
    }


def test_the_models_own_window_served_as_the_library_cuts_it(make_client, ce_dir):
    from cisrank.rerank.cross_encoder import CrossEncoderReranker

    reranker = CrossEncoderReranker(model=str(ce_dir), dtype="float32", max_length=16)
    client = make_client({"ce": reranker})  # the server's default chunking: the model's window
    documents = [
        "fleas can live up to a year depending on conditions. " * 3 + "shakespeare wrote hamlet.",
        "paris is the capital of france.",
    ]
    want = reranker.rank(QUERY, documents, chunking=Chunking())
    assert want.chunks.chunked_documents == 1
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": documents})
    assert r.status_code == 200, r.text
    got = r.json()["results"]
    assert [x["index"] for x in got] == [p.index for p in want]
    for g, w in zip(got, want, strict=True):
        assert g["relevance_score"] == pytest.approx(w.score, abs=1e-5)
        assert (g["best_chunk"]["start"], g["best_chunk"]["end"]) == (
            w.best_chunk.start,  # type: ignore[union-attr]
            w.best_chunk.end,  # type: ignore[union-attr]
        )
    assert r.json()["usage"]["windows_scored"] == want.chunks.windows_scored


FITS = "two words"  # one window of the 4-word model


@pytest.mark.parametrize("pooling", ["max", "first"])
def test_truncation_false_refuses_the_document_that_does_not_fit_naming_it(make_client, pooling):
    """Voyage's `truncation: false` (and TEI's `truncate: false`): a document longer than the
    window is refused, naming it, before any model work; `first` pooling, which scores one
    window of it, refuses it as well (the rest of it would be cut)."""
    reranker = WindowedOverlap()
    client = make_client({"w": reranker}, chunking=Chunking(overlap_tokens=0, pooling=pooling))
    body = {"query": "q", "documents": [FITS, LONG], "truncation": False}
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 422, r.text
    (problem,) = r.json()["fields"]
    assert problem["field"] == "documents.1"
    assert "window of 4 tokens" in problem["message"] and "10 windows long" in problem["message"]
    r = client.post("/rerank", json={"query": "q", "texts": [LONG, FITS], "truncate": False})
    assert r.status_code == 422, r.text
    assert r.json()["fields"][0]["field"] == "texts.0"
    assert reranker.calls == []
    # the documents that fit are served; truncation true (the default) chunks the long one
    r = client.post("/v1/rerank", json={**body, "documents": [FITS, FITS]})
    assert r.status_code == 200, r.text
    r = client.post("/v1/rerank", json={**body, "truncation": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["chunked_documents"] == 1


def test_a_voyage_body_is_served(make_client):
    """voyageai's `Client.rerank` body: `top_k`, `return_documents`, `truncation`."""
    client = make_client({"w": OverlapReranker()})
    body = {
        "query": "who wrote hamlet",
        "documents": ["paris is in france", "shakespeare wrote hamlet"],
        "model": "w",
        "top_k": 1,
        "return_documents": True,
        "truncation": True,
    }
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    (result,) = r.json()["results"]
    assert result["index"] == 1 and result["document"] == {"text": "shakespeare wrote hamlet"}


def test_ten_thousand_documents_a_request_by_default_one_more_is_refused(make_client):
    reranker = OverlapReranker()
    client = make_client({"w": reranker})
    documents = [f"passage {i} about hamlet" if i % 7 else f"passage {i}" for i in range(10_000)]
    r = client.post("/v1/rerank", json={"query": "hamlet", "documents": documents, "top_n": 3})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["documents"] == 10_000
    scores = [overlap("hamlet", d) for d in documents]
    want = sorted(range(10_000), key=lambda i: (-scores[i], i))[:3]
    assert [x["index"] for x in r.json()["results"]] == want
    r = client.post("/v1/rerank", json={"query": "hamlet", "documents": [*documents, "one more"]})
    assert r.status_code == 422, r.text
    assert "10001 documents, over the limit of 10000" in r.json()["fields"][0]["message"]


SENTENCE = "fleas can live up to a year depending on conditions shakespeare wrote hamlet"


def test_one_request_of_n_scores_as_n_requests_of_one(make_client, ce_dir):
    """A request larger than a model batch is scored in sub-batches (4 pairs here): its scores
    are those of each document sent alone, so a document's score does not depend on the
    request that carried it."""
    from cisrank.rerank.cross_encoder import CrossEncoderReranker
    from cisrank.serving.config import BatchingConfig

    reranker = CrossEncoderReranker(model=str(ce_dir), dtype="float32")
    client = make_client({"ce": reranker}, batching=BatchingConfig(max_batch_passages=4))
    words = SENTENCE.split()
    documents = [" ".join(words[i % 5 : i % 5 + 2 + i]) for i in range(11)]
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": documents})
    assert r.status_code == 200, r.text
    together = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    for i, doc in enumerate(documents):
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": [doc]})
        assert r.status_code == 200, r.text
        assert together[i] == pytest.approx(r.json()["results"][0]["relevance_score"], abs=1e-5)
    assert len(set(round(s, 4) for s in together.values())) > 5  # the scores are not all equal
