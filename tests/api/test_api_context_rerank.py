"""`/v1/context` and `/v1/generate` with `"rerank": {"reranker": NAME, "top_k": k}`: a served
reranker chooses the passages first (the pipeline `cisrank eval rag` measures), its cost counted
in the request's budget before any work, errors 422 naming the field."""

from __future__ import annotations

import pytest
from api_fakes import OverlapReranker, overlap
from test_api_context import _docs, _passages

from cisrank.context import ContextAssembler, EnsembleDecoder
from cisrank.data.types import Passage
from cisrank.rerank.base import PassageWindow
from cisrank.rerank.chunking import Chunking
from cisrank.serving.config import Limits

QUESTION = "when was the author of hamlet born ?"


@pytest.fixture
def cis(tiny_cis):
    return tiny_cis


def _best(docs: list[dict], k: int) -> tuple[list[int], list[float]]:
    """The overlap reranker's top k by brute force: title and text are what it reads."""
    scores = [overlap(QUESTION, f"{d['title']}\n{d['text']}") for d in docs]
    best = sorted(range(len(docs)), key=lambda i: (-scores[i], i))[:k]
    return best, [scores[i] for i in best]


def test_context_arranges_the_rerankers_top_k(make_client, cis):
    words = OverlapReranker()
    client = make_client({"cis": cis, "overlap": words})
    docs = _docs(5)
    body = {
        "query": QUESTION,
        "documents": docs,
        "arrange": "curvature",
        "model": "cis",
        "rerank": {"reranker": "overlap", "top_k": 3},
    }
    r = client.post("/v1/context", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    best, scores = _best(docs, 3)
    assert out["rerank"] == {
        "reranker": "overlap",
        "indexes": best,
        "scores": pytest.approx(scores),
        "best_chunks": [None, None, None],  # a reranker without a window reads them whole
        "chunks": {"chunked_documents": 0, "windows_scored": 5, "windows_dropped": 0},
    }
    assert words.calls == [(QUESTION, tuple(f"{d['title']}\n{d['text']}" for d in docs))]
    want = ContextAssembler(cis.engine, "qa").arrange(
        QUESTION, [_passages(docs)[i] for i in best], "curvature"
    )
    assert out["order"] == [best[i] for i in want.order]  # the request's documents
    assert out["ids"] == [docs[best[i]]["id"] for i in want.order]
    assert out["prompt"] == want.prompt.text and out["scores"] == pytest.approx(want.scores)
    assert out["usage"]["documents"] == 3
    # a top_k over the documents takes them all; without rerank nothing changes
    r = client.post("/v1/context", json={**body, "rerank": {"reranker": "overlap", "top_k": 60}})
    assert r.status_code == 200 and sorted(r.json()["rerank"]["indexes"]) == list(range(5))
    plain = {k: v for k, v in body.items() if k != "rerank"}
    r = client.post("/v1/context", json=plain)
    assert r.status_code == 200 and r.json()["rerank"] is None


def test_generate_answers_over_the_top_k_weighted_by_the_reranker(make_client, cis):
    """replug without client scores takes the reranker's as its weights."""
    client = make_client({"cis": cis, "overlap": OverlapReranker()})
    docs = _docs(5)
    body = {
        "query": QUESTION,
        "documents": docs,
        "decoding": "replug",
        "max_new_tokens": 3,
        "rerank": {"reranker": "overlap", "top_k": 2},
    }
    r = client.post("/v1/generate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    best, scores = _best(docs, 2)
    want = EnsembleDecoder(ContextAssembler(cis.engine, "entropy")).generate(
        QUESTION, [_passages(docs)[i] for i in best], "replug", scores=scores, max_new_tokens=3
    )
    assert out["tokens"] == want.tokens and out["rerank"]["indexes"] == best
    assert out["attribution"] == [docs[best[s.passage]]["id"] for s in want.steps]
    assert out["usage"]["documents"] == 2
    # naive with an order: `order` indexes the request's documents
    naive = {**body, "decoding": "naive", "arrange": "reverse"}
    r = client.post("/v1/generate", json=naive)
    assert r.status_code == 200 and r.json()["order"] == best[::-1]


@pytest.mark.parametrize("route", ["/v1/context", "/v1/generate"])
def test_rerank_errors_name_the_field(make_client, cis, route):
    client = make_client(
        {"cis": cis, "overlap": OverlapReranker()}, limits=Limits(max_generate_documents=4)
    )
    base = {"query": QUESTION, "documents": _docs(5)}
    for rerank, field in (
        ({"reranker": "nope", "top_k": 2}, "rerank.reranker"),
        ({"reranker": "overlap", "top_k": 0}, "rerank.top_k"),
        ({"reranker": "overlap"}, "rerank.top_k"),
        ({"reranker": "overlap", "top_k": 2, "top_n": 1}, "rerank.top_n"),
    ):
        r = client.post(route, json={**base, "rerank": rerank})
        assert r.status_code == 422, r.text
        assert r.json()["fields"][0]["field"] == field, r.text
    if route == "/v1/generate":  # six documents ranked, over the 4 generated, is fine
        r = client.post(
            route, json={**base, "max_new_tokens": 2, "rerank": {"reranker": "overlap", "top_k": 2}}
        )
        assert r.status_code == 200, r.text
        r = client.post(route, json={**base, "rerank": {"reranker": "overlap", "top_k": 5}})
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == "rerank.top_k"
        r = client.post(route, json={"query": QUESTION, "documents": _docs(5)})
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == "documents"


@pytest.mark.parametrize("route", ["/v1/context", "/v1/generate"])
def test_the_rerank_cost_counts_in_the_budget_before_any_work(make_client, cis, route, monkeypatch):
    """A request whose prompts fit the budget alone, and not with the ranking of its documents:
    refused before the reranker or the LM runs. The prompt bound is the costliest top_k."""
    words = OverlapReranker()
    engine_calls = []
    monkeypatch.setattr(cis.engine, "encode", lambda *a, **kw: engine_calls.append(a) or [])
    docs = _docs(2) + [{"text": "filler words " * 200, "title": "Long", "id": "long"}] * 3
    body = {"query": QUESTION, "documents": docs, "rerank": {"reranker": "overlap", "top_k": 1}}
    if route == "/v1/generate":
        body["max_new_tokens"] = 1
    from cisrank.context.templates import TEMPLATES, resolve_template
    from cisrank.serving.assembly import costliest, prompt_size
    from cisrank.serving.token_count import utf8_bytes

    template = resolve_template(TEMPLATES["qa" if route == "/v1/context" else "entropy"], {})
    chosen = costliest(template, QUESTION, _passages(docs), 1, False)
    assert chosen[0].docid == "long"  # the bound is the longest document's prompt
    # the overlap reranker declares no tokenizer: its pairs cost their UTF-8 bytes; the prompt
    # costs its LM tokens, at most its characters here (ASCII, a byte-level tokenizer)
    prompt = prompt_size(template, QUESTION, chosen, False).chars
    ranking = sum(utf8_bytes(QUESTION) + utf8_bytes(f"{d['title']}\n{d['text']}") for d in docs)
    assert ranking > prompt
    client = make_client(
        {"cis": cis, "overlap": words}, limits=Limits(max_request_cost=ranking + 1)
    )
    r = client.post(route, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["fields"][0]["field"] == "documents" and "to rerank the documents" in r.text
    assert words.calls == [] and engine_calls == []


class WindowedOverlap(OverlapReranker):
    """`OverlapReranker` whose model reads 4 words of a passage."""

    passage_window = PassageWindow(4, None)


PAGE = "filler words about nothing much at all here, then hamlet author born 1564"


@pytest.mark.parametrize("route", ["/v1/context", "/v1/generate"])
def test_a_long_document_goes_in_as_its_best_window_and_the_span_is_said(make_client, cis, route):
    """A page longer than the reranker's window is ranked by its best window (max pooling, as
    /v1/rerank) and only that window's span of its text goes in the prompt, said in
    `rerank.best_chunks`; a document that fits goes in whole (null)."""
    words = WindowedOverlap()
    client = make_client({"cis": cis, "w": words}, chunking=Chunking(overlap_tokens=0))
    docs = [
        {"text": "hamlet", "title": "", "id": "short"},
        {"text": PAGE, "title": "", "id": "page"},
    ]
    body = {"query": QUESTION, "documents": docs, "model": "cis", "arrange": "ranked"}
    body["rerank"] = {"reranker": "w", "top_k": 2}
    if route == "/v1/generate":
        body |= {"decoding": "naive", "max_new_tokens": 2}
    r = client.post(route, json=body)
    assert r.status_code == 200, r.text
    out = r.json()["rerank"]
    # the page's windows of 4 words (no overlap): the third overlaps the question most
    window = "then hamlet author born"
    start = PAGE.index(window)
    end = start + len(window)
    best = overlap(QUESTION, window)
    assert out["indexes"] == [1, 0]
    assert out["scores"] == pytest.approx([best, overlap(QUESTION, "hamlet")])
    assert out["best_chunks"] == [{"start": start, "end": end, "score": best}, None]
    assert out["chunks"] == {"chunked_documents": 1, "windows_scored": 5, "windows_dropped": 0}
    if route == "/v1/context":
        prompt = r.json()["prompt"]
        assert window in prompt and "filler" not in prompt and "1564" not in prompt
        want = ContextAssembler(cis.engine, "qa").arrange(
            QUESTION, [Passage("page", window), Passage("short", "hamlet")], "ranked"
        )
        assert prompt == want.prompt.text


def test_a_page_over_the_models_context_is_served_by_its_best_window(make_client, cis):
    """The prompt's size is bounded over the windows the ranking can pick, not the whole pages:
    a page whose prompt cannot fit the LM's context is refused without `rerank` and served with
    it, its best window in the prompt."""
    client = make_client({"cis": cis, "w": WindowedOverlap()}, chunking=Chunking(overlap_tokens=0))
    page = "filler words " * 2000 + "then hamlet author born"
    body = {"query": QUESTION, "documents": [{"text": page, "id": "page"}], "model": "cis"}
    r = client.post("/v1/context", json=body)
    assert r.status_code == 422 and "context" in r.text, r.text
    r = client.post("/v1/context", json={**body, "rerank": {"reranker": "w", "top_k": 1}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["rerank"]["best_chunks"][0]["start"] == page.index("then hamlet author born")
    assert "then hamlet author born" in out["prompt"] and "filler" not in out["prompt"]
