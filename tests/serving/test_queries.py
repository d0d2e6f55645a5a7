"""The engine's queries carry their limits, without the web: a `top_n` of 0 or -3 is refused
where the query is made, one over the running config's limit by the engine, each as the
`InvalidField` naming `top_n` that the API answers with a 422 naming it; and cisrank's own wire
bodies are those queries."""

from __future__ import annotations

import asyncio

import pytest

from cisrank.api import schemas
from cisrank.data.types import SearchHit
from cisrank.rerank.base import BaseReranker
from cisrank.serving import Metrics, RankingService, ServerConfig, Serving
from cisrank.serving.config import Limits, RerankerSpec
from cisrank.serving.errors import InvalidField
from cisrank.serving.types import (
    ContextQuery,
    GenerateQuery,
    NoiseSpec,
    RerankQuery,
    SearchQuery,
)

DOCS = ["a b c", "b", "x y", "a b"]


class Shared(BaseReranker):
    """Scores a passage by the words it shares with the query."""

    name = "shared"
    model_name = "shared-v1"

    def score_batch(self, requests):
        return [[float(len(set(q.split()) & set(p.split()))) for p in ps] for q, ps in requests]


class Listed:
    """The passages of `DOCS` in their order, as a first stage."""

    name = "listed"
    docs = None

    def search(self, query, k=10):
        return [SearchHit(f"d{i}", -float(i), t) for i, t in enumerate(DOCS)][:k]


def answers(*queries):
    """Each query's answer (or the `InvalidField` raised) from one engine serving `Shared` and
    `Listed`, with search capped at 3 passages."""

    async def run():
        config = ServerConfig(
            rerankers={"s": RerankerSpec(kind="dense", model="shared-v1")},
            limits=Limits(max_search_top_n=3),
        )
        serving = Serving(config, Metrics(), rerankers={"s": Shared()}, retrievers={"l": Listed()})
        service = RankingService(serving)
        out = []
        try:
            for q in queries:
                call = service.search if isinstance(q, SearchQuery) else service.rerank
                try:
                    out.append(await call(q))
                except InvalidField as exc:
                    out.append(exc)
        finally:
            await serving.aclose()
        return out

    return asyncio.run(run())


@pytest.mark.parametrize("top_n", [0, -3])
def test_a_top_n_under_one_is_refused_naming_it(top_n):
    for make in (
        lambda: RerankQuery(query="a b", documents=DOCS, top_n=top_n),
        lambda: SearchQuery(query="a b", top_n=top_n),
    ):
        with pytest.raises(InvalidField) as info:
            make()
        assert (info.value.field, info.value.detail) == (
            "top_n",
            "Input should be greater than or equal to 1",
        )


def test_the_engine_refuses_a_top_n_over_its_limit_and_cuts_to_one_in_range():
    over, found, ranked, every = answers(
        SearchQuery(query="a b", top_n=4),
        SearchQuery(query="a b", top_n=2, rerank="s"),  # depth: the limit, 3
        RerankQuery(query="a b", documents=DOCS, top_n=2),
        RerankQuery(query="a b", documents=DOCS, top_n=9),
    )
    assert isinstance(over, InvalidField)
    assert (over.field, over.detail) == ("top_n", "4 is over the limit of 3")
    assert [(r.rank, r.docid, r.rerank_score) for r in found.results] == [
        (1, "d0", 2.0),
        (2, "d1", 1.0),
    ]
    assert found.documents == 3
    assert [r.index for r in ranked.results] == [0, 3]
    assert [r.index for r in every.results] == [0, 3, 1, 2]


@pytest.mark.parametrize(
    ("make", "field", "detail"),
    [
        (lambda: RerankQuery(query="\u200b", documents=DOCS), "query", "Value error, must not"),
        (lambda: RerankQuery(query="q", documents=[]), "documents", "Value should have at least 1"),
        (lambda: RerankQuery(query="q", documents=DOCS, top_k=2), "top_k", "Extra inputs"),
        (lambda: RerankQuery(query="q", documents=DOCS, top_n="2"), "top_n", "Input should be"),
        (lambda: SearchQuery(query="q", depth=0), "depth", "Input should be greater"),
        (lambda: NoiseSpec(n=-1), "n", "Input should be greater than or equal to 0"),
        (
            lambda: ContextQuery(query="q", documents=["a", {"text": "b", "id": 2.5}]),
            "documents.1.id",
            "Input should be",
        ),
        (lambda: GenerateQuery(query="q", documents=["a"], tau=1e-9), "tau", "Value error"),
    ],
)
def test_every_limit_of_a_query_is_an_invalid_field(make, field, detail):
    with pytest.raises(InvalidField) as info:
        make()
    assert info.value.field == field and info.value.detail.startswith(detail)


def test_the_native_wire_bodies_are_the_engine_queries():
    for wire, query in [
        (schemas.SearchRequest, SearchQuery),
        (schemas.ContextRequest, ContextQuery),
        (schemas.GenerateRequest, GenerateQuery),
        (schemas.NoiseIn, NoiseSpec),
    ]:
        assert issubclass(wire, query)
        assert set(wire.model_fields) == set(query.model_fields)
    body = schemas.SearchRequest.model_validate({"query": "a b", "top_k": 2})
    assert isinstance(body, SearchQuery) and (body.query, body.top_n, body.depth) == (
        "a b",
        2,
        None,
    )
