"""POST /v1/generate with a tiny CIS reranker: the library's generation, and its bounds."""

from __future__ import annotations

import json
import time

import pytest
from api_fakes import OverlapReranker

from cisrank import testing
from cisrank.context import ContextAssembler
from cisrank.context.decoding import DecodingTimeout, EnsembleDecoder
from cisrank.data.types import Passage
from cisrank.errors import CisrankError
from cisrank.serving.config import BatchingConfig, Limits

QUESTION = "when was the author of hamlet born ?"


@pytest.fixture(scope="module")
def cis(tiny_gpt2_dir):
    from cisrank.rerank.cis import CISReranker

    return CISReranker(model=str(tiny_gpt2_dir), template="qa")


def _docs(k: int) -> list[dict]:
    return [
        {"text": testing.SAMPLE_SENTENCES[i], "title": f"T{i}", "id": f"d{i}"} for i in range(k)
    ]


def _passages(k: int) -> list[Passage]:
    return [Passage(d["id"], d["text"], d["title"]) for d in _docs(k)]


def test_clehe_and_naive_equal_the_library(make_client, cis):
    client = make_client({"cis": cis})
    body = {"query": QUESTION, "documents": _docs(3), "decoding": "clehe", "layers": [1, 2]}
    r = client.post("/v1/generate", json={**body, "max_new_tokens": 4})
    assert r.status_code == 200, r.text
    out = r.json()
    asm = ContextAssembler(cis.engine, "entropy")
    want = EnsembleDecoder(asm, layers=[1, 2]).generate(
        QUESTION, _passages(3), "clehe", max_new_tokens=4
    )
    assert out["tokens"] == want.tokens and out["answer"] == want.text
    assert out["attribution"] == [f"d{s.passage}" for s in want.steps]
    assert out["layers"] == [s.layer for s in want.steps]
    got_w = [w for step in out["weights"] for w in step]
    assert got_w == pytest.approx([w for s in want.steps for w in s.weights], abs=1e-6)
    assert out["usage"]["documents"] == 3 and out["usage"]["generated_tokens"] == len(want.tokens)

    naive = {"query": QUESTION, "documents": _docs(3), "arrange": "curvature", "max_new_tokens": 3}
    r = client.post("/v1/generate", json=naive)
    assert r.status_code == 200, r.text
    order = asm.arrange(QUESTION, _passages(3), "curvature").order
    gen = EnsembleDecoder(asm).generate(
        QUESTION, [_passages(3)[i] for i in order], "naive", max_new_tokens=3
    )
    assert r.json()["order"] == order and r.json()["tokens"] == gen.tokens
    assert r.json()["attribution"] == [None] * len(gen.tokens)


def test_naive_generation_scores_only_the_search(make_client, cis, monkeypatch):
    """A naive generation with a scored arrangement prefills its K search prompts and then the
    generation's own prompt: the arranged prompt is not also gauged (K + 1 rows before)."""
    engine = cis.engine
    rows: list[int] = []
    score_spans = engine.score_spans

    def counted(spans, **kw):
        rows.append(len(spans))
        return score_spans(spans, **kw)

    monkeypatch.setattr(engine, "score_spans", counted)
    client = make_client({"cis": cis})
    body = {"query": QUESTION, "documents": _docs(5), "arrange": "curvature", "max_new_tokens": 2}
    r = client.post("/v1/generate", json=body)
    assert r.status_code == 200, r.text
    order = r.json()["order"]
    assert order not in [[(i + s) % 5 for i in range(5)] for s in range(5)]  # not a rotation
    assert sum(rows) == 5


def test_generation_is_bounded(make_client, cis):
    client = make_client(
        {"cis": cis, "dense": OverlapReranker()},
        limits=Limits(max_new_tokens=8, max_generate_documents=3),
    )
    base = {"query": QUESTION, "documents": _docs(2), "max_new_tokens": 4}
    cases = [
        ({"max_new_tokens": 9}, "max_new_tokens", "over the limit of 8"),
        ({"documents": _docs(4)}, "documents", "over the limit of 3"),
        ({"decoding": "replug"}, "scores", "one score per document"),
        ({"decoding": "replug", "scores": [1.0]}, "scores", "one score per document"),
        ({"decoding": "clehe", "layers": [7]}, "layers", "must be in 0..2"),
        ({"decoding": "beam"}, "decoding", "clehe"),
        ({"tau": 0}, "tau", "greater than 0"),
        ({"model": "dense"}, "model", "has no causal language model"),
        ({"documents": []}, "documents", "at least 1"),
    ]
    for change, field, message in cases:
        r = client.post("/v1/generate", json={**base, **change})
        assert r.status_code == 422, (change, r.text)
        assert r.json()["fields"][0]["field"] == field, (change, r.text)
        assert message in r.text, (change, r.text)
    ok = client.post("/v1/generate", json={**base, "decoding": "replug", "scores": [2.0, 0.5]})
    assert ok.status_code == 200, ok.text


def test_generation_stops_at_its_deadline(make_client, cis):
    with pytest.raises(DecodingTimeout, match="deadline after 0 tokens"):
        EnsembleDecoder(ContextAssembler(cis.engine)).generate(
            QUESTION, _passages(2), "leens", deadline=time.monotonic() - 1
        )
    assert issubclass(DecodingTimeout, CisrankError)
    client = make_client({"cis": cis}, batching=BatchingConfig(request_timeout_s=0.001))
    r = client.post("/v1/generate", json={"query": QUESTION, "documents": _docs(2)})
    assert r.status_code == 503 and r.json()["error"] == "timeout", r.text


def test_non_finite_decoding_inputs_are_422_naming_the_field(make_client, cis):
    """Before, NaN or Infinity in `scores` (JSON's non-standard constants, which Python's parser
    reads), a `tau` so small that softmax(-H / tau) is NaN and a `beta` so large that the contrast
    is inf - inf answered 200 with tokens [0, 0, ...] and null weights; a `scores` of the wrong
    length with a non-replug decoding was an IndexError (500)."""
    client = make_client({"cis": cis})
    base = json.dumps({"query": QUESTION, "documents": _docs(3), "max_new_tokens": 2})[:-1]
    cases = [
        ('"decoding": "replug", "scores": [NaN, 1, 2]', "scores.0", "finite number"),
        ('"decoding": "replug", "scores": [1, Infinity, 2]', "scores.1", "finite number"),
        ('"decoding": "replug", "scores": [1, 2, -Infinity]', "scores.2", "finite number"),
        ('"decoding": "replug", "scores": [1, 2, 1e999]', "scores.2", "finite number"),
        ('"decoding": "leens", "tau": 5e-324', "tau", "at least 0.0001"),
        ('"decoding": "clehe", "tau": NaN', "tau", "finite number"),
        ('"decoding": "clehe", "beta": 1e308', "beta", "at most 100"),
        ('"decoding": "clehe", "beta": Infinity', "beta", "finite number"),
        ('"decoding": "leens", "scores": [1.0]', "scores", "1 scores for 3 documents"),
        ('"decoding": "naive", "scores": [1, 2, 3, 4]', "scores", "4 scores for 3 documents"),
    ]
    for extra, field, message in cases:
        raw = f"{base}, {extra}}}"
        r = client.post("/v1/generate", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422, (extra, r.text)
        assert r.json()["fields"][0]["field"] == field, (extra, r.text)
        assert message in r.text, (extra, r.text)
    # the bounds leave every value the paper and the CLI use
    for extra in ('"decoding": "clehe", "tau": 0.25, "beta": 0.25', '"tau": 1e-4, "beta": 100'):
        r = client.post(
            "/v1/generate",
            content=f"{base}, {extra}}}",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 200, (extra, r.text)
    ok = client.post("/v1/generate", json={**json.loads(base + "}"), "scores": [1, 2, 3]})
    assert ok.status_code == 200, ok.text
