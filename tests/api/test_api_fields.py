"""One name per idea, and no silently ignored field: the result count is `top_n` in every request
(`top_k` accepted as its alias) and `--top-n` in every verb (`--top-k` and `-k` its aliases); an
unknown request field is a 422 naming it, except the documented fields of the Cohere and TEI rerank
shapes, which are accepted."""

from __future__ import annotations

import json

import pytest
from api_fakes import ListRetriever, OverlapReranker
from typer.testing import CliRunner

from cisrank import testing
from cisrank.cli import app

CORPUS = {f"p{i}": s for i, s in enumerate(testing.SAMPLE_SENTENCES)}


@pytest.fixture
def client(make_client):
    return make_client({"ov": OverlapReranker()}, retrievers={"wiki": ListRetriever(CORPUS)})


def _field(r) -> str:
    assert r.status_code == 422, r.text
    return r.json()["fields"][0]["field"]


def test_top_k_is_top_n_on_search_and_rerank(client):
    """`/v1/search {"top_k": 3}` was ignored: 10 hits came back."""
    r = client.post("/v1/search", json={"query": "hamlet", "top_k": 3})
    assert r.status_code == 200 and len(r.json()["results"]) == 3, r.text
    assert len(client.post("/v1/search", json={"query": "hamlet"}).json()["results"]) == 10
    docs = testing.SAMPLE_SENTENCES[:5]
    for key in ("top_n", "top_k"):
        r = client.post("/v1/rerank", json={"query": "hamlet", "documents": docs, key: 2})
        assert r.status_code == 200 and len(r.json()["results"]) == 2, r.text
    # both at once: the alias is named
    r = client.post("/v1/search", json={"query": "hamlet", "top_n": 3, "top_k": 3})
    assert _field(r) == "top_k" and "top_k is an alias of top_n" in r.text
    r = client.post("/v1/search", json={"query": "hamlet", "top_k": 0})
    assert _field(r) == "top_k" and "greater than or equal to 1" in r.text  # as it was sent


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/rerank", {"query": "q", "documents": ["a"], "topn": 3}, "topn"),
        (
            "/v2/rerank",
            {"query": "q", "documents": ["a"], "return_document": True},
            "return_document",
        ),
        ("/rerank", {"query": "q", "documents": ["a"], "x": 1}, "x"),
        ("/rerank", {"query": "q", "texts": ["a"], "return_documents": True}, "return_documents"),
        ("/v1/search", {"query": "q", "k": 3}, "k"),
        ("/v1/context", {"query": "q", "documents": ["a"], "arrangement": "edges"}, "arrangement"),
        (
            "/v1/context",
            {"query": "q", "documents": ["a"], "noise": {"n": 1, "pool": []}},
            "noise.pool",
        ),
        ("/v1/generate", {"query": "q", "documents": ["a"], "temperature": 0}, "temperature"),
        ("/v1/embeddings", {"input": "a", "encoding": "float"}, "encoding"),
    ],
)
def test_an_unknown_field_is_422_naming_it(client, path, body, field):
    r = client.post(path, json=body)
    assert _field(r) == field, r.text
    assert "unknown field" in r.json()["fields"][0]["message"]


def test_the_documented_fields_of_the_shapes_users_bring_are_accepted(client):
    docs = [{"text": "hamlet", "id": "a", "meta": {"x": 1}}, "other"]
    cohere = {"rank_fields": ["text"], "max_chunks_per_doc": 3, "priority": 1}
    r = client.post("/v1/rerank", json={"query": "hamlet", "documents": docs, **cohere})
    assert r.status_code == 200, r.text
    tei = {"raw_scores": True, "return_text": True, "truncate": True}
    r = client.post("/rerank", json={"query": "hamlet", "texts": ["hamlet", "x"], **tei})
    assert r.status_code == 200, r.text
    r = client.post("/rerank", json={"query": "q", "texts": ["a"], "truncation_direction": "Right"})
    assert r.status_code == 200, r.text


def _hits(index, *flags: str) -> int:
    result = CliRunner().invoke(
        app, ["search", "--index", str(index), "--query", "hamlet", "--json", *flags]
    )
    assert result.exit_code == 0, result.output
    return len(json.loads(result.output)["hits"])


def test_the_cli_counts_with_top_n_and_its_aliases(tmp_path):
    """`cisrank search -k` was the one verb without `--top-n`; every verb takes it now."""
    from cisrank.indexes.build import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in CORPUS.items()))
    build_index("bm25", corpus, tmp_path / "bm25", progress=False)
    for flags in [("--top-n", "2"), ("--top-k", "2"), ("-k", "2")]:
        assert _hits(tmp_path / "bm25", *flags) == 2, flags
    for verb in ("search", "rerank", "context", "generate"):
        help_text = CliRunner().invoke(app, [verb, "--help"], terminal_width=200).output
        assert "--top-n" in help_text and "--top-k" in help_text, (verb, help_text)
