"""The cost of `/v1/context` and `/v1/generate` is the rendered prompt's: reserved template fields,
every reference of a field or of a passage's text, ids, capped fields and ids, and a character bound
that refuses before anything is rendered or tokenized."""

from __future__ import annotations

import pytest
from api_fakes import config_for

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.context.templates import TEMPLATES, resolve_template
from cisrank.data.types import Passage
from cisrank.serving.config import Limits

QUESTION = "when was the author of hamlet born ?"
ROUTES = ["/v1/context", "/v1/generate"]


@pytest.fixture(scope="module")
def cis(tiny_gpt2_dir):
    from cisrank.rerank.cis import CISReranker

    return CISReranker(model=str(tiny_gpt2_dir), template="qa")


@pytest.fixture
def tokenized(cis, monkeypatch):
    """The texts the model's tokenizer was asked to encode during the test."""
    seen: list[int] = []
    encode = cis.engine.encode

    def counted(text, *args, **kwargs):
        seen.append(len(text))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(cis.engine, "encode", counted)
    return seen


def _client(cis, **limits):
    from fastapi.testclient import TestClient

    app = create_app(config_for(["cis"], limits=Limits(**limits)), rerankers={"cis": cis})
    return TestClient(app, raise_server_exceptions=False)


def _docs(k: int, chars: int | None = None, **extra) -> list[dict]:
    docs = []
    for i in range(k):
        text = testing.SAMPLE_SENTENCES[i]
        if chars is not None:
            text = (text + " ") * (chars // (len(text) + 1))
        docs.append({"text": text, "title": f"T{i}", **extra})
    return docs


def _refused(r, field: str, *needles: str) -> None:
    assert r.status_code == 422, r.text
    assert r.json()["fields"][0]["field"] == field, r.text
    for needle in needles:
        assert needle in r.text, r.text


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("reserved", ["question", "documents"])
def test_a_reserved_field_is_422_naming_it(cis, route, reserved):
    """`fields` naming `question` or `documents` was a 500 (`str.format() got multiple values
    for keyword argument`)."""
    r = _client(cis).post(
        route, json={"query": QUESTION, "documents": _docs(2), "fields": {reserved: "Q"}}
    )
    _refused(r, f"fields.{reserved}", "reserved")


@pytest.mark.parametrize("route", ROUTES)
def test_repeated_passage_text_is_refused_before_anything_is_tokenized(cis, tokenized, route):
    """The reported attack's 3 documents of 30,000 characters with a document format of
    `{text}` x 100 (1.8M tokens rendered before): refused naming `document_format`, the
    tokenizer untouched."""
    body = {"query": QUESTION, "documents": _docs(3, 30_000), "document_format": "{text}" * 100}
    r = _client(cis).post(route, json=body)
    _refused(r, "document_format", "cannot fit the model's context", "from document_format")
    assert tokenized == []


@pytest.mark.parametrize("route", ROUTES)
def test_a_field_referenced_many_times_counts_every_time(cis, tokenized, route):
    """A template naming one field 100 times (a 250 KB field once rendered 5M tokens): the
    field is capped at `max_query_chars`, and within it, every reference counts."""
    template = "{documents} " + "{f} " * 100 + "{question}"
    client = _client(cis)
    body = {"query": QUESTION, "documents": _docs(2), "template": template}
    r = client.post(route, json={**body, "fields": {"f": "x" * 250_000}})
    _refused(r, "fields.f", "250000 characters, over the limit of 8192")
    r = client.post(route, json={**body, "fields": {"f": "x" * 8000}})
    _refused(r, "fields.f", "800000 from fields.f")
    assert tokenized == []


@pytest.mark.parametrize("route", ROUTES)
def test_ids_are_capped_and_counted(cis, tokenized, route):
    """An id of 4 MB rendered with `{id}` was 2M tokens: an id is at most `max_id_chars`, and
    every `{id}` reference counts."""
    client = _client(cis)
    docs = _docs(2)
    docs[1]["id"] = "i" * 4_000_000
    r = client.post(route, json={"query": QUESTION, "documents": docs, "document_format": "{id}"})
    _refused(r, "documents.1.id", "4000000 characters, over the limit of 256")
    body = {"query": QUESTION, "documents": _docs(3, id="i" * 256)}
    r = client.post(route, json={**body, "document_format": "{id} " * 100 + "{text}"})
    _refused(r, "document_format", "cannot fit the model's context")
    assert tokenized == []


def test_the_cost_budget_counts_repetitions_within_the_context(cis, tokenized):
    """Prompts that fit the context can still cost more than `max_request_cost`: the search
    prompts of a curvature arrangement, each with its passages rendered ten times."""
    client = _client(cis, max_request_cost=2000)
    body = {"query": QUESTION, "documents": _docs(4), "arrange": "curvature"}
    assert client.post("/v1/context", json=body).status_code == 200
    r = client.post("/v1/context", json={**body, "document_format": "{title}: {text}\n" * 10})
    _refused(r, "document_format", "over the limit of 2000", "most of them from document_format")


def _rendered(template, query, passages) -> int:
    before, question, after = template.render(query, passages)
    return len(before + question + after)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_estimate_is_the_rendered_length_exactly(name):
    from cisrank.serving.assembly import prompt_size

    passages = [Passage(f"id-{i}", "text " * i + "é", f"title {i}") for i in range(12)]
    formats = [None, "{text}" * 3, "[{index}] {id}: {title} {{x}} {text} {id}"]
    for document in formats:
        template = resolve_template(TEMPLATES[name], {}, document)
        for chosen in ([], passages[:1], passages):
            size = prompt_size(template, QUESTION, chosen, document is not None)
            assert size.chars == _rendered(template, QUESTION, chosen), (name, document)
            single = template.single()
            size = prompt_size(single, QUESTION, chosen, document is not None)
            assert size.chars == _rendered(single, QUESTION, chosen), (name, document)
    custom = resolve_template("{a}{documents}{a}{b} {question}{a}", {"a": "xyz", "b": ""})
    size = prompt_size(custom, QUESTION, passages, False)
    assert size.chars == _rendered(custom, QUESTION, passages)
    assert size.parts["fields.a"] == 9
