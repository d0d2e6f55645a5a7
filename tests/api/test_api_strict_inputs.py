"""Strict inputs: a value of another JSON type than its field's is a 422 naming the field, one blank
rule holds for every text, a key given twice is refused, and a request whose documents are all blank
is not scored. Before: `top_n: true` returned 1 result, `top_n: "2"` and `return_documents: "yes"`
were accepted, `"\\u200b\\ufeff"` and `"\\u0000"` passed as a query, `{"top_n": 1, "top_n": 5}`
meant 5, and documents that were all `""` were scored."""

from __future__ import annotations

import json

import pytest
from api_fakes import ListRetriever, OverlapReranker

from cisrank import testing
from cisrank.api.schemas import GenerateRequest

CORPUS = {f"p{i}": s for i, s in enumerate(testing.SAMPLE_SENTENCES)}
DOCS = ["hamlet is a play", "paris is in france", "hamlet and paris"]


@pytest.fixture
def client(make_client):
    return make_client({"ov": OverlapReranker()}, retrievers={"wiki": ListRetriever(CORPUS)})


def _refused(r) -> tuple[str, str]:
    assert r.status_code == 422, r.text
    field = r.json()["fields"][0]
    return field["field"], field["message"]


@pytest.mark.parametrize(
    ("path", "change", "field"),
    [
        ("/v1/rerank", {"top_n": True}, "top_n"),
        ("/v1/rerank", {"top_n": "2"}, "top_n"),
        ("/v1/rerank", {"top_k": False}, "top_k"),
        ("/v1/rerank", {"top_n": 2.0}, "top_n"),
        ("/v1/rerank", {"return_documents": "yes"}, "return_documents"),
        ("/v1/rerank", {"return_documents": 1}, "return_documents"),
        ("/v1/rerank", {"max_tokens_per_doc": "8"}, "max_tokens_per_doc"),
        ("/v1/rerank", {"documents": [{"text": "a", "id": True}]}, "documents.0"),
        ("/v1/rerank", {"documents": [{"text": 5}]}, "documents.0"),
        ("/rerank", {"texts": DOCS, "documents": None, "raw_scores": "false"}, "raw_scores"),
        ("/v1/search", {"top_n": "3"}, "top_n"),
        ("/v1/context", {"chat": "no"}, "chat"),
        ("/v1/context", {"seed": "1"}, "seed"),
        ("/v1/generate", {"max_new_tokens": True}, "max_new_tokens"),
    ],
)
def test_a_value_of_another_type_is_422_naming_its_field(client, path, change, field):
    body = {"query": "hamlet", "documents": DOCS, **change}
    body = {k: v for k, v in body.items() if v is not None}
    if path == "/v1/search":
        body.pop("documents")
    assert _refused(client.post(path, json=body))[0] == field


def test_the_right_types_still_pass_and_a_float_field_takes_an_integer(client):
    r = client.post("/v1/rerank", json={"query": "hamlet", "documents": DOCS, "top_n": 2})
    assert r.status_code == 200 and len(r.json()["results"]) == 2
    r = client.post(
        "/v1/rerank", json={"query": "hamlet", "documents": DOCS, "return_documents": True}
    )
    assert {x["document"]["text"] for x in r.json()["results"]} == set(DOCS)
    assert GenerateRequest.model_validate({"query": "q", "documents": ["a"], "tau": 1}).tau == 1.0


BLANKS = ["\u200b\ufeff", "\u0000", " \t\r\n", "\u3164", "\u2028\u200d\u2060", ""]


@pytest.mark.parametrize("query", BLANKS)
@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v1/search", "/v1/context"])
def test_one_blank_rule_for_every_query(client, path, query):
    body = {"query": query} if path == "/v1/search" else {"query": query, "documents": DOCS}
    field, message = _refused(client.post(path, json=body))
    assert field == "query"
    assert message in (
        "Value error, must not be empty or blank (only whitespace, control or zero-width "
        "characters)",
        "String should have at least 1 character",
    )


def test_documents_that_are_all_blank_are_not_scored(client):
    for docs in (["", ""], ["\u200b", " ", "\u0000"]):
        r = client.post("/v1/rerank", json={"query": "hamlet", "documents": docs})
        assert _refused(r) == (
            "documents",
            "every document is blank (only whitespace, control or zero-width characters): "
            "send at least one with visible text",
        )
        assert _refused(client.post("/rerank", json={"query": "hamlet", "texts": docs}))[0] in (
            "texts",
            "documents",
        )
    # one blank document among others is ranked (last), as before
    r = client.post("/v1/rerank", json={"query": "hamlet", "documents": ["", "hamlet"]})
    assert r.status_code == 200 and [x["index"] for x in r.json()["results"]] == [1, 0]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"query": "q", "documents": ["a"], "top_n": 1, "top_n": 5}', "top_n"),
        ('{"query": "q", "query": "p", "documents": ["a"]}', "query"),
        (
            '{"query": "q", "documents": [{"text": "a"}, {"text": "b", "id": 1, "id": 2}]}',
            "documents.1.id",
        ),
    ],
)
def test_a_key_given_twice_is_422_naming_it(client, raw, field):
    r = client.post("/v1/rerank", content=raw, headers={"content-type": "application/json"})
    name, message = _refused(r)
    assert name == field
    assert message == (
        f"the key '{field.rsplit('.', 1)[-1]}' is given twice in one object: send each key once"
    )
    assert r.json()["fields"][0]["type"] == "duplicate_key"


def test_is_blank():
    from cisrank.serving.types import is_blank

    for text in BLANKS:
        assert is_blank(text), repr(text)
    for text in ("a", "\u200ba", " 0", "\u00e9", "\u4e2d", "\U0001f600", "\ue000"):
        assert not is_blank(text), repr(text)
    assert json.dumps("\u200b") == '"\\u200b"'  # what a client sends for it
