"""Served equals library: every reranker kind, served, answers what
`load_reranker(kind, model, **options).rank` answers on the same input.

Each kind of the registry (`KINDS`) is served on `/v1/rerank`, `/v2/rerank` and `/rerank` (in
Cohere's shape and in TEI's), as the server builds it (`RerankerSpec.build(serving=True)`): in
this process with requests sliced by the batcher (`max_batch_passages` 1 and 2), and on 2 worker
processes (each slice of 2 dealt to both copies). In several document orders and `top_n`
values, the order must be the library's and the scores the library's (to 1e-5: a causal LM's
log-likelihoods round differently in another batch shape). The hybrid fuses per query (min-max
over the request's candidates, the first stage by position): before its fusion was combined over
the whole request, a slice or a worker's share was fused on its own, and the served hybrid gave
other scores and another order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cisrank.api.app import create_app
from cisrank.rerank.base import Reranker
from cisrank.rerank.chunking import Chunking
from cisrank.rerank.pooled import PooledReranker
from cisrank.rerank.registry import KINDS, load_reranker
from cisrank.serving.config import BatchingConfig, RerankerSpec, ServerConfig
from cisrank.serving.engine import text_embedder
from cisrank.testing import SAMPLE_SENTENCES

QUERY = "When was the author of Hamlet born?"
DOCUMENTS = SAMPLE_SENTENCES[:5]
# (document order, top_n): the order a client sends matters to the hybrid's first stage
CASES = [
    ([0, 1, 2, 3, 4], None),
    ([4, 3, 2, 1, 0], 1),
    ([2, 4, 0, 3, 1], 3),
]


@dataclass(frozen=True)
class Variant:
    """One served setting of a kind: its model and options (JSON, as a server config names
    them)."""

    kind: str
    model: str | None
    options_json: str = "{}"

    @property
    def options(self) -> dict[str, Any]:
        return json.loads(self.options_json)

    @property
    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": self.model, "options": self.options}


def _variant(kind: str, model: Path, **options: Any) -> Variant:
    return Variant(kind, str(model), json.dumps(options, sort_keys=True))


@dataclass(frozen=True)
class TinyModels:
    lm: Path
    bert: Path
    cross_encoder: Path


# One entry per kind of the registry, each with the tiny-model settings to serve: a kind added to
# the registry without an entry here fails `test_every_kind_is_served_as_the_library_ranks`.
VARIANTS: dict[str, Callable[[TinyModels], list[Variant]]] = {
    "cis": lambda m: [
        _variant("cis", m.lm, estimator="forward", template="qa"),
        _variant("cis", m.lm, estimator="reverse"),
    ],
    "cross-encoder": lambda m: [_variant("cross-encoder", m.cross_encoder)],
    "dense": lambda m: [_variant("dense", m.bert)],
    # the student shipped with cisrank (22M parameters: real, and small enough to serve here)
    "student": lambda m: [Variant("student", None)],
    "hybrid": lambda m: [
        _variant(
            "hybrid",
            m.lm,
            fuse="cis:0.4,first-stage:0.1,dense:0.5",
            estimator="reverse",
            models={"dense": str(m.bert)},
        ),
    ],
}


@pytest.fixture(scope="module")
def tiny(tiny_gpt2_dir, tiny_bert_dir, ce_dir) -> TinyModels:
    return TinyModels(tiny_gpt2_dir, tiny_bert_dir, ce_dir)


@contextmanager
def _served(
    reranker: Reranker, variant: Variant, passages: int | None, chunking: Chunking | None = None
) -> Iterator[TestClient]:
    batching = BatchingConfig() if passages is None else BatchingConfig(max_batch_passages=passages)
    config = ServerConfig(
        rerankers={"served": RerankerSpec.model_validate(variant.spec)},
        batching=batching,
        chunking=chunking or Chunking(),
    )
    app = create_app(config, rerankers={"served": reranker}, api_keys=[])
    with TestClient(app, raise_server_exceptions=True) as client:
        yield client


def _answers(
    client: TestClient, documents: list[str], top_n: int | None, logits: bool
) -> dict[str, list]:
    """(index, score) pairs, best first, of every rerank route and shape."""
    body: dict[str, Any] = {"query": QUERY, "documents": documents, "model": "served"}
    if top_n is not None:
        body["top_n"] = top_n
    out = {}
    for path in ("/v1/rerank", "/v2/rerank", "/rerank"):
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        out[path] = [(r["index"], r["relevance_score"]) for r in response.json()["results"]]
    for raw in (True, False):
        tei = {"query": QUERY, "texts": documents, "raw_scores": raw}
        response = client.post("/rerank", json=tei)
        assert response.status_code == 200, response.text
        got = [(r["index"], r["score"]) for r in response.json()]
        # TEI's default is a sigmoid of a logit: undo it to compare with the library's (the
        # order is the raw one either way); a bi-encoder's cosine is answered as is; a TEI
        # answer is never cut at top_n
        out[f"/rerank TEI raw_scores={raw}"] = [
            (i, s if raw or not logits else math.log(s / (1.0 - s))) for i, s in got
        ][:top_n]
    return out


def _check(client: TestClient, library: Reranker, where: str) -> None:
    for order, top_n in CASES:
        documents = [DOCUMENTS[i] for i in order]
        want = [(r.index, r.score) for r in library.rank(QUERY, documents, top_n=top_n)]
        logits = text_embedder(library) is None
        for route, got in _answers(client, documents, top_n, logits).items():
            what = f"{where}, {route}, order {order}, top_n {top_n}"
            assert [i for i, _ in got] == [i for i, _ in want], f"{what}: order"
            for (_, g), (_, w) in zip(got, want, strict=True):
                assert g == pytest.approx(w, abs=1e-5, rel=1e-5), f"{what}: {got} != {want}"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_is_served_as_the_library_ranks(kind, tiny):
    if kind not in VARIANTS:
        pytest.fail(
            f"reranker kind '{kind}' has no tiny-model setting in VARIANTS: add one, so that "
            "its served scores are checked against load_reranker's"
        )
    for variant in VARIANTS[kind](tiny):
        library = load_reranker(variant.kind, variant.model, **variant.options)
        local = RerankerSpec.model_validate({**variant.spec, "workers": 1}).build(serving=True)
        assert not isinstance(local, PooledReranker)
        pooled = RerankerSpec.model_validate({**variant.spec, "workers": 2}).build(serving=True)
        try:
            assert isinstance(pooled, PooledReranker) and pooled.pool is not None
            # the pooled one last: a server's shutdown closes its workers
            for reranker, passages in ((local, 1), (local, 2), (pooled, 2)):
                where = f"{variant}, {type(reranker).__name__}, max_batch_passages {passages}"
                with _served(reranker, variant, passages) as client:
                    _check(client, library, where)
        finally:
            pooled.close()


# Long documents: several sentences each, the relevant one late in some, cut into windows of 6
# tokens overlapping by 2 (the server's config), at most 4 windows a document (the request's);
# and the same texts as records ranked by their `rank_fields` (title and body lines).
LONG = [
    " ".join(SAMPLE_SENTENCES[i] for i in order)
    for order in ([5, 6, 7, 4], [0, 1], [6, 7, 5, 2, 3], [2])
]
CHUNKING = Chunking(window_tokens=6, overlap_tokens=2, pooling="max")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_long_documents_are_served_as_the_library_chunks_them(kind, tiny):
    variant = VARIANTS[kind](tiny)[0]
    library = load_reranker(variant.kind, variant.model, **variant.options)
    served = RerankerSpec.model_validate({**variant.spec, "workers": 1}).build(serving=True)
    asked = CHUNKING.replace(max_chunks_per_doc=4)
    want = library.rank(QUERY, LONG, chunking=asked)
    assert want.chunks is not None and want.chunks.windows_dropped > 0
    fields = ["title", "body"]
    records = [{"id": f"r{i}", "title": f"part {i}", "body": text} for i, text in enumerate(LONG)]
    want_records = library.rank(QUERY, records, chunking=asked, rank_fields=fields)
    with _served(served, variant, 2, CHUNKING) as client:
        body = {"query": QUERY, "documents": LONG, "max_chunks_per_doc": 4}
        response = client.post("/v1/rerank", json={**body, "return_documents": True})
        assert response.status_code == 200, response.text
        answer = response.json()
        structured = {**body, "documents": records, "rank_fields": fields}
        response = client.post("/v1/rerank", json=structured)
        assert response.status_code == 200, response.text
        by_fields = response.json()["results"]
    # records ranked by their fields' lines, long ones chunked: the library's, span for span
    assert [r["index"] for r in by_fields] == [r.index for r in want_records]
    for g, w in zip(by_fields, want_records, strict=True):
        assert w.best_chunk is not None and g["id"] == records[w.index]["id"]
        assert g["relevance_score"] == pytest.approx(w.score, abs=1e-5, rel=1e-5)
        assert (g["best_chunk"]["start"], g["best_chunk"]["end"]) == (
            w.best_chunk.start,
            w.best_chunk.end,
        )
    got = answer["results"]
    assert [r["index"] for r in got] == [r.index for r in want]
    for g, w in zip(got, want, strict=True):
        assert w.best_chunk is not None
        assert g["relevance_score"] == pytest.approx(w.score, abs=1e-5, rel=1e-5)
        assert g["best_chunk"] == {
            "start": w.best_chunk.start,
            "end": w.best_chunk.end,
            "score": pytest.approx(w.best_chunk.score, abs=1e-5, rel=1e-5),
            "text": LONG[w.index][w.best_chunk.start : w.best_chunk.end],
        }
        assert w.best_chunk.end - w.best_chunk.start < len(LONG[w.index])  # a part, cut
    chunks = want.chunks
    assert answer["usage"] == {
        "documents": 4,
        "truncated_documents": 0,
        "chunked_documents": chunks.chunked_documents,
        "windows_scored": chunks.windows_scored,
        "windows_dropped": chunks.windows_dropped,
    }
