"""Each wire shape names the field an engine error blames as its clients sent it
(`cisrank.api.shapes.renaming`): exact renamings, and through the app for every shape."""

from __future__ import annotations

import pytest

from cisrank.api.schemas import (
    ContextDocumentIn,
    DocumentIn,
    EmbeddingsRequest,
    RerankRequest,
    TeiRerankRequest,
)
from cisrank.api.shapes.renaming import fields_renamed, item_texts, query_of, renamed_list
from cisrank.serving.errors import InvalidField
from cisrank.serving.types import EmbedQuery, RerankQuery


@pytest.mark.parametrize(
    ("single", "engine", "wire"),
    [
        (False, "texts", "input"),
        (False, "texts.3", "input.3"),
        (True, "texts.0", "input"),
        (True, "texts", "input"),
        (False, "model", "model"),
        (False, "textsx", "textsx"),
        (False, "texts.2.text", "input.2.text"),
    ],
)
def test_a_list_renamed(single, engine, wire):
    assert renamed_list("texts", "input", single)(engine) == wire


def test_items_sent_as_strings_or_objects():
    docs = ["plain", DocumentIn(text="object")]
    cohere = item_texts({"documents": docs}, objects=False)  # the engine's items are strings
    assert [cohere(f) for f in ("documents.0", "documents.1", "documents", "query")] == [
        "documents.0",
        "documents.1.text",
        "documents",
        "query",
    ]
    noise = [ContextDocumentIn(text="n"), "m"]
    native = item_texts({"documents": docs, "noise.documents": noise}, objects=True)
    assert [
        native(f)
        for f in (
            "documents.0.text",
            "documents.1.text",
            "documents.0.id",
            "noise.documents.0.text",
            "noise.documents.1.text",
            "documents.9.text",
        )
    ] == [
        "documents.0",
        "documents.1.text",
        "documents.0.id",
        "noise.documents.0.text",
        "noise.documents.1",
        "documents.9.text",
    ]


def test_fields_renamed_keeps_the_detail_and_lets_others_pass():
    with pytest.raises(InvalidField) as caught, fields_renamed(renamed_list("texts", "input")):
        raise InvalidField("texts.1", "must not be empty")
    assert (caught.value.field, caught.value.detail) == ("input.1", "must not be empty")
    assert caught.value.message == "input.1: must not be empty"
    with pytest.raises(KeyError), fields_renamed(renamed_list("texts", "input")):
        raise KeyError("texts")


def test_every_shape_blames_a_long_text_as_sent(make_client, tiny_dense, tiny_cis):
    from cisrank.serving.config import Limits

    rerankers = {"dense": tiny_dense, "cis": tiny_cis}
    client = make_client(rerankers, limits=Limits(max_document_chars=10))
    long = "x" * 11
    context = {"query": "q", "model": "cis"}
    cases = [
        ("/v1/rerank", {"query": "q", "documents": ["a", long]}, "documents.1"),
        ("/v1/rerank", {"query": "q", "documents": ["a", {"text": long}]}, "documents.1.text"),
        ("/rerank", {"query": "q", "texts": ["a", long]}, "texts.1"),
        ("/v1/embeddings", {"input": ["a", long]}, "input.1"),
        ("/v1/embeddings", {"input": long}, "input"),
        ("/v1/context", {**context, "documents": ["a", long]}, "documents.1"),
        ("/v1/context", {**context, "documents": [{"text": long}]}, "documents.0.text"),
        ("/v1/generate", {**context, "documents": ["a", long]}, "documents.1"),
        (
            "/v1/context",
            {**context, "documents": ["a"], "noise": {"n": 1, "documents": ["b", long]}},
            "noise.documents.1",
        ),
        (
            "/v1/context",
            {**context, "documents": ["a"], "noise": {"n": 1, "documents": [{"text": long}]}},
            "noise.documents.0.text",
        ),
    ]
    for path, body, field in cases:
        r = client.post(path, json=body)
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == field, (path, r.text)


def test_a_shape_body_becomes_the_engine_query_by_its_shared_names():
    cohere = RerankRequest.model_validate(
        {"query": "q", "documents": ["a", {"text": "b"}], "top_k": 2, "max_tokens_per_doc": 8}
    )
    assert query_of(RerankQuery, cohere, documents=["a", "b"]) == RerankQuery(
        query="q", documents=["a", "b"], top_n=2, max_tokens_per_doc=8
    )
    tei = TeiRerankRequest.model_validate({"query": "q", "texts": ["a"], "model": "m"})
    assert query_of(RerankQuery, tei, documents=tei.texts, normalize="sigmoid") == RerankQuery(
        query="q", documents=["a"], model="m", normalize="sigmoid"
    )  # TEI has no top_n: the query's default
    openai = EmbeddingsRequest.model_validate({"input": "a", "dimensions": 3})
    assert query_of(EmbedQuery, openai, texts=["a"]) == EmbedQuery(texts=["a"], dimensions=3)
