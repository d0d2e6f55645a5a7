"""`cisrank.api.body.read_json_body` alone: the rules behind the edge's answers, at their limits."""

from __future__ import annotations

import json
import time

import pytest

from cisrank.api.body import MAX_DEPTH, BodyError, read_json_body


def _nest(levels: int, leaf: str = "x") -> bytes:
    value: object = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return json.dumps(value).encode()


def _error(raw: bytes, content_type: str | None = None) -> BodyError:
    with pytest.raises(BodyError) as info:
        read_json_body(raw, content_type)
    return info.value


@pytest.mark.parametrize("leaf", ["x", '\\"[[[[' * 40 + "\\\\", "]]}}" * 40, "{[" * 80])
def test_depth_limit_is_exact_and_ignores_brackets_in_strings(leaf):
    assert read_json_body(_nest(MAX_DEPTH, leaf), None) is not None
    error = _error(_nest(MAX_DEPTH + 1, leaf))
    assert (error.status, error.field, error.kind) == (400, "body", "json_too_deep")


def test_surrogate_pairs_are_text_and_lone_halves_are_not():
    assert read_json_body(b'["\\ud83d\\ude00", "\\uD7FF"]', None) == ["\U0001f600", "\ud7ff"]
    for raw, field in [
        (b'["ok", "\\ude00\\ud83d"]', "1"),  # reversed pair: two lone halves
        (b'{"a": {"b": ["x", "y", "\\udbff"]}}', "a.b.2"),
        (b'{"a": [{"\\udc00": 1}]}', "a.0"),
        (b'"\\ud800"', "body"),
    ]:
        error = _error(raw)
        assert (error.status, error.field, error.kind) == (422, field, "lone_surrogate"), raw


def test_an_escaped_backslash_before_u_is_not_a_surrogate():
    assert read_json_body(b'["\\\\ud800"]', None) == ["\\ud800"]


def test_the_first_lone_surrogate_in_document_order_is_named():
    docs = ["fine"] * 1000 + ["a\ud800", "b\udfff"]
    error = _error(json.dumps({"documents": docs}).encode())
    assert error.field == "documents.1000"


def test_locating_a_lone_surrogate_among_many_members_stays_linear():
    """A 1.2 MB body of 400,000 tiny arrays with a lone surrogate at its end: located by
    halving with json's C encoder, not by a Python walk over every member."""
    raw = b'{"documents": [' + b",".join([b"[]"] * 400_000) + b', "\\ud800"]}'
    started = time.perf_counter()
    error = _error(raw)
    elapsed = time.perf_counter() - started
    reference = time.perf_counter()
    json.loads(raw)
    parse = time.perf_counter() - reference
    assert error.field == "documents.400000"
    assert elapsed < 6 * parse + 1.0, (elapsed, parse)


def test_an_integer_of_more_than_4300_digits_is_400_naming_its_offset():
    """Issue 32, finding 1: `json.loads` raises a bare ValueError (no position) for an integer
    of more digits than Python converts; it was a 500 on every JSON route."""
    raw = b'{"query": "q",\n "top_n": 1' + b"0" * 5000 + b"}"
    error = _error(raw)
    assert (error.status, error.field, error.kind) == (400, "body", "json_invalid")
    assert "5001 digits at line 2 column 11 (char 25)" in error.message, error.message
    # digits inside a string are text, and a long float is a number (inf), not an integer
    long_id = b'{"id": "' + b"7" * 9000 + b'", "x": -' + b"9" * 4301 + b"}"
    assert "4301 digits at line 1 column 9017 (char 9016)" in _error(long_id).message
    assert read_json_body(b"[1" + b"0" * 5000 + b".5]", None) == [float("inf")]
    assert read_json_body(b"[" + b"9" * 4300 + b"]", None) == [int("9" * 4300)]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/v1/search",
        "/v1/context",
        "/v1/generate",
        "/v1/embeddings",
    ],
)
def test_a_huge_integer_is_400_on_every_json_route(make_client, path):
    from api_fakes import OverlapReranker

    client = make_client({"ov": OverlapReranker()})
    raw = b'{"query": "q", "documents": ["a"], "top_n": 1' + b"0" * 5000 + b"}"
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["fields"] == [
        {
            "field": "body",
            "message": "a JSON integer is too long (5001 digits at line 1 column 45 (char 44)): "
            "at most 4300 digits are read; send a number that fits the field, or a long "
            "identifier as a string",
            "type": "json_invalid",
        }
    ]
