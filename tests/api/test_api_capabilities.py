"""The API reads what rerankers and retrievers declare: each reranker kind declares its own
tokenizer, pair-token limit, causal LM and prior store, and the services use exactly those, whatever
the reranker's class; a retriever declares its document store."""

from __future__ import annotations

import pytest
from api_fakes import ListRetriever, OverlapReranker

from cisrank import testing
from cisrank.errors import CisrankError
from cisrank.rerank.base import IdentityReranker, Reranker
from cisrank.serving.config import BatchingConfig, Limits, RerankerSpec

QUESTION = "when was the author of hamlet born ?"


@pytest.fixture(scope="module")
def cis(tiny_gpt2_dir):
    from cisrank.rerank.cis import CISReranker

    return CISReranker(model=str(tiny_gpt2_dir), template="qa")


def _capabilities(r: Reranker) -> tuple:
    return (r.fast_tokenizer, r.pair_token_limit, r.causal_lm, r.prior_store)


def test_each_reranker_declares_its_own(tiny_dense, cis, tiny_bert_dir, tmp_path):
    from sentence_transformers import CrossEncoder

    from cisrank.rerank.cis import CISReranker
    from cisrank.rerank.cross_encoder import CrossEncoderReranker
    from cisrank.rerank.hybrid import HybridReranker

    assert _capabilities(IdentityReranker()) == (None, None, None, None)
    assert _capabilities(OverlapReranker()) == (None, None, None, None)

    tok = tiny_dense.runner.tokenizer
    assert tok.is_fast and tiny_dense.fast_tokenizer is tok
    assert tiny_dense.pair_token_limit == tiny_dense.runner.max_length > 0
    assert (tiny_dense.causal_lm, tiny_dense.prior_store) == (None, None)

    assert cis.causal_lm is cis.engine and cis.fast_tokenizer is cis.engine.tokenizer
    assert (cis.pair_token_limit, cis.prior_store) == (None, None)  # no store given
    stored = CISReranker(engine=cis.engine, prior_store=str(tmp_path / "priors.sqlite"))
    assert stored.prior_store is not None and stored.prior_store.stats() == {
        "hits": 0,
        "misses": 0,
    }

    CrossEncoder(str(tiny_bert_dir), num_labels=1).save_pretrained(str(tmp_path / "ce"))
    ce = CrossEncoderReranker(model=str(tmp_path / "ce"), max_length=24, dtype="float32")
    assert ce.fast_tokenizer is ce.tokenizer and ce.pair_token_limit == 24
    assert (ce.causal_lm, ce.prior_store) == (None, None)

    hybrid = HybridReranker(fuse="dense:0.5,first-stage:0.5", components={"dense": tiny_dense})
    assert _capabilities(hybrid) == (None, None, None, None)  # several models: none of its own
    for r in (tiny_dense, cis, ce, hybrid):
        assert isinstance(r, Reranker)


def test_a_pooled_reranker_answers_with_its_local_copy(tiny_gpt2_dir):
    from cisrank.jobs.pool import WorkerOptions
    from cisrank.rerank.pooled import PooledReranker

    spec = RerankerSpec(kind="cis", model=str(tiny_gpt2_dir), options={"template": "qa"})
    pooled = PooledReranker(spec, WorkerOptions(workers=1))
    local = pooled.local
    assert pooled.pool is None
    assert _capabilities(pooled) == _capabilities(local)
    assert pooled.causal_lm is not None and pooled.fast_tokenizer is not None


def test_the_batcher_caps_a_pair_at_the_declared_limit(make_client):
    capped = OverlapReranker()
    capped.pair_token_limit = 7
    client = make_client(
        {"capped": capped, "plain": OverlapReranker()},
        limits=Limits(max_request_cost=10),
        batching=BatchingConfig(max_inflight_cost=10),
    )
    scorers = client.app.state.serving.scorers
    assert scorers["capped"].token_cap == 7 and scorers["plain"].token_cap is None
    # a 4,000-character document costs 7 tokens where the model reads at most 7: under a
    # budget of 10 on the capped reranker, over it on the plain one
    body = {"query": "q", "documents": ["x" * 4000]}
    assert client.post("/v1/rerank", json={**body, "model": "capped"}).status_code == 200
    r = client.post("/v1/rerank", json={**body, "model": "plain"})
    assert r.status_code == 422 and "cost 4001 tokens" in r.text, r.text


def test_context_runs_on_any_reranker_that_declares_a_causal_lm(make_client, cis):
    """Not the class (a CIS reranker) but the declaration decides: an overlap reranker that
    declares the CIS reranker's LM assembles with it, and one that declares none is refused."""
    with_lm = OverlapReranker()
    with_lm.causal_lm = cis.engine
    client = make_client({"plain": OverlapReranker(), "lm": with_lm})
    docs = [{"text": s, "id": f"d{i}"} for i, s in enumerate(testing.SAMPLE_SENTENCES[:3])]
    body = {"query": QUESTION, "documents": docs, "arrange": "reverse"}
    r = client.post("/v1/context", json=body)  # the default (plain) has none: the first with one
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "lm" and r.json()["ids"] == ["d2", "d1", "d0"]
    r = client.post("/v1/context", json={**body, "model": "plain"})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "model", r.text
    assert "reranker 'plain' has no causal language model" in r.text
    assert "(served here: lm)" in r.text


def test_noise_from_an_index_without_a_document_store_is_422_naming_noise_index(make_client, cis):
    client = make_client({"cis": cis}, retrievers={"toy": ListRetriever({"d1": "a passage"})})
    body = {
        "query": QUESTION,
        "documents": ["one passage", "another passage"],
        "noise": {"n": 1, "index": "toy"},
    }
    r = client.post("/v1/context", json=body)
    assert r.status_code == 422, r.text
    field = r.json()["fields"][0]
    assert field["field"] == "noise.index"
    assert field["message"] == "index 'toy' has no document store to draw noise from"


def test_a_factory_that_builds_no_reranker_is_refused_by_name():
    with pytest.raises(CisrankError, match="'builtins:list' built a list, which is not a Reranker"):
        RerankerSpec(kind="builtins:list", model="ab").build(serving=True)
    built = RerankerSpec(kind="api_fakes:slow_reranker", options={"delay": 0}).build(serving=True)
    assert isinstance(built, Reranker) and built.causal_lm is None
