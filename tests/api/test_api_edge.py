"""Hostile bodies at the edge, through a real uvicorn server and one keep-alive connection.

Text holding a lone UTF-16 surrogate (JSON `"\\ud800"`) in any string field is a 4xx naming the
field, never a 500 and never scored; a body the server cannot parse says why (not UTF-8, nested too
deep, truncated where, no or the wrong Content-Type); and after any error, a 500 included, the same
keep-alive connection answers the next request.

The server runs in a thread of this process (uvicorn on a socket bound to 127.0.0.1:0), so the
test sees the reranker's calls; the client is one `http.client.HTTPConnection`, whose socket the
test checks is never replaced.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from api_fakes import ListRetriever, OverlapReranker, config_for

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.serving.config import Limits

GOOD = {"query": "who wrote hamlet", "documents": ["Shakespeare wrote Hamlet.", "Paris"]}
CORPUS = {f"d{i}": s for i, s in enumerate(testing.SAMPLE_SENTENCES)}


@contextmanager
def live_server(app) -> Iterator[int]:
    """uvicorn serving `app` in a thread on a free loopback port; yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_keep_alive=30)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class Conn:
    """One keep-alive HTTP/1.1 connection; `post` sends raw bytes and fails if the server closed
    the connection in between (http.client would otherwise reconnect without saying so)."""

    def __init__(self, port: int) -> None:
        self.http = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        self.http.connect()
        self.sock = self.http.sock

    def post(
        self, path: str, body: bytes, content_type: str | None = "application/json"
    ) -> tuple[int, dict[str, str], Any]:
        assert self.http.sock is self.sock, "the server closed the keep-alive connection"
        headers = {"Content-Length": str(len(body))}
        if content_type is not None:
            headers["Content-Type"] = content_type
        self.http.putrequest("POST", path, skip_accept_encoding=True)
        for name, value in headers.items():
            self.http.putheader(name, value)
        self.http.endheaders(body)
        response = self.http.getresponse()
        raw = response.read()
        assert not response.will_close, f"the server closes the connection after {raw[:200]!r}"
        return response.status, dict(response.getheaders()), json.loads(raw)

    def good(self) -> None:
        status, _, body = self.post("/v1/rerank", json.dumps(GOOD).encode())
        assert status == 200, body
        assert self.http.sock is self.sock

    def close(self) -> None:
        self.http.close()


@pytest.fixture(scope="module")
def served():
    """(port, reranker): an OverlapReranker named `ov` (model id `overlap-v1`) and a list index."""
    reranker = OverlapReranker()
    reranker.fail_on = "explode"
    limits = Limits(max_documents=20, max_document_chars=500, max_query_chars=200)
    app = create_app(
        config_for(["ov"], limits=limits),
        rerankers={"ov": reranker},
        retrievers={"toy": ListRetriever(CORPUS)},
        api_keys=[],
    )
    with live_server(app) as port:
        yield port, reranker


@pytest.fixture
def conn(served):
    c = Conn(served[0])
    yield c
    c.close()


def _fields(body: dict) -> list[str]:
    return [f["field"] for f in body["fields"]]


LONE = "a\ud800b"  # json.dumps writes it as the escape "a\ud800b", as a client's JSON would

# (path, body, the field the 4xx must name)
SURROGATES = [
    ("/v1/rerank", {**GOOD, "query": LONE}, "query"),
    ("/v1/rerank", {**GOOD, "model": LONE}, "model"),
    ("/v1/rerank", {**GOOD, "model": "\udfff"}, "model"),
    ("/v1/rerank", {**GOOD, "documents": ["x", "y", "z", LONE]}, "documents.3"),
    ("/v1/rerank", {**GOOD, "documents": ["x", {"text": LONE}]}, "documents.1.text"),
    ("/v1/rerank", {**GOOD, "documents": [{"text": "x", "id": LONE}]}, "documents.0.id"),
    (
        "/v1/rerank",
        {**GOOD, "documents": [{"text": "x", "title": LONE}], "return_documents": True},
        "documents.0.title",
    ),
    (
        "/v1/rerank",
        {**GOOD, "documents": [{"text": "x", "meta": {"tags": ["ok", LONE]}}]},
        "documents.0.meta.tags.1",
    ),
    (
        "/v1/rerank",
        {**GOOD, "documents": [{"text": "x", "\ud800": 1}], "return_documents": True},
        "documents.0",
    ),
    ("/v1/rerank", {**GOOD, "rank_fields": [LONE]}, "rank_fields.0"),  # an ignored extra too
    ("/v2/rerank", {**GOOD, "normalize": LONE}, "normalize"),
    ("/v1/search", {"query": LONE}, "query"),
    ("/v1/search", {"query": "hamlet", "index": LONE}, "index"),
    ("/v1/search", {"query": "hamlet", "rerank": LONE}, "rerank"),
]


def test_lone_surrogates_in_every_field_are_422_naming_it_on_one_connection(served, conn):
    """Finding 2: each field holding a lone surrogate gets a 4xx naming it; the same keep-alive
    connection answers a valid request after each (it was dropped after each 500 before)."""
    reranker = served[1]
    for path, body, field in SURROGATES:
        raw = json.dumps(body).encode()
        assert b"\\ud800" in raw or b"\\udfff" in raw  # the escape travels, as JSON allows
        status, _, answer = conn.post(path, raw)
        assert status == 422, (path, field, answer)
        assert answer["error"] == "invalid_request", answer
        assert field in _fields(answer), (field, answer)
        assert "surrogate" in answer["message"], answer
        conn.good()
    texts = [t for q, passages in reranker.calls for t in (q, *passages)]
    assert all(t.encode("utf-8") for t in texts)  # the reranker never saw one


def test_a_lone_surrogate_document_never_reaches_the_reranker(served, conn):
    """Finding 1, the edge part: the poisoned document is refused before tokenizer or batcher."""
    reranker = served[1]
    before = len(reranker.calls)
    body = {"query": "poison test", "documents": ["a", "b", "c", "a\ud800"]}
    status, _, answer = conn.post("/v1/rerank", json.dumps(body).encode())
    assert status == 422, answer
    assert _fields(answer) == ["documents.3"], answer
    assert all(q != "poison test" for q, _ in reranker.calls[before:])
    conn.good()


def test_the_real_tokenizer_never_sees_a_lone_surrogate(tiny_dense):
    """The same through the tiny BERT's fast tokenizer, which raises on such text (a 500 today)."""
    app = create_app(config_for(["tiny"]), rerankers={"tiny": tiny_dense}, api_keys=[])
    with live_server(app) as port:
        c = Conn(port)
        try:
            body = {"query": "hamlet", "documents": ["Shakespeare wrote Hamlet.", {"text": LONE}]}
            status, _, answer = c.post("/v1/rerank", json.dumps(body).encode())
            assert status == 422 and _fields(answer) == ["documents.1.text"], answer
            body["documents"][1] = {"text": "a\ufffdb"}  # U+FFFD, the replacement, is valid text
            status, _, answer = c.post("/v1/rerank", json.dumps(body).encode())
            assert status == 200, answer
        finally:
            c.close()


def test_after_any_error_the_keep_alive_connection_keeps_working(served, conn):
    """A 500 (a reranker bug), 400, 415, 404 and 422, each followed by a 200 on one connection."""
    status, _, answer = conn.post(
        "/v1/rerank", json.dumps({"query": "explode", "documents": ["a"]}).encode()
    )
    assert status == 500 and answer["error"] == "internal_error", answer
    conn.good()
    for raw, content_type, expected in [
        (b'{"query": ', "application/json", 400),
        (b"\xff", "application/json", 400),
        (json.dumps(GOOD).encode(), "text/plain", 415),
        (json.dumps({"query": ""}).encode(), "application/json", 422),
    ]:
        status, _, answer = conn.post("/v1/rerank", raw, content_type)
        assert status == expected, answer
        conn.good()
    status, _, answer = conn.post("/v1/nothing", b"{}")
    assert status == 404, answer
    conn.good()


# ---- finding 11: parse errors say which


def test_invalid_utf8_says_so_and_where(conn):
    raw = b'{"query": "caf\xe9", "documents": ["a"]}'  # latin-1, not UTF-8
    status, _, answer = conn.post("/v1/rerank", raw)
    assert status == 400, answer
    assert _fields(answer) == ["body"]
    assert "not valid UTF-8" in answer["message"] and "offset 14" in answer["message"], answer


def test_utf8_encoded_surrogates_are_invalid_utf8(conn):
    raw = b'{"query": "a\xed\xa0\x80", "documents": ["a"]}'  # CESU-style bytes of U+D800
    status, _, answer = conn.post("/v1/rerank", raw)
    assert status == 400 and "not valid UTF-8" in answer["message"], answer


@pytest.mark.parametrize("opener", [b"[", b'{"a":'])
def test_json_nested_100000_deep_says_nesting_too_deep(conn, opener):
    raw = opener * 100_000
    status, _, answer = conn.post("/v1/rerank", raw)
    assert status == 400, answer
    assert _fields(answer) == ["body"]
    assert "nested too deep" in answer["message"], answer
    assert "Recursion" not in answer["message"]
    conn.good()


def test_moderately_deep_json_is_refused_by_the_same_rule(conn):
    """Deep enough for the refusal (over 64 levels) but not for Python's recursion limit."""
    inner: Any = "x"
    for _ in range(100):
        inner = {"a": inner}
    body = {**GOOD, "documents": [{"text": "x", "meta": inner}]}
    status, _, answer = conn.post("/v1/rerank", json.dumps(body).encode())
    assert status == 400 and "nested too deep" in answer["message"], answer


def test_truncated_json_says_where(conn):
    raw = json.dumps(GOOD).encode()[:-7]
    status, _, answer = conn.post("/v1/rerank", raw)
    assert status == 400, answer
    assert _fields(answer) == ["body"]
    message = answer["message"]
    assert "malformed JSON" in message and f"char {len(raw)}" in message, message
    assert "ends early" in message, message


def test_malformed_json_in_the_middle_says_line_and_column(conn):
    raw = b'{"query": "q",\n "documents": ["a" "b"]}'
    status, _, answer = conn.post("/v1/rerank", raw)
    assert status == 400, answer
    assert "line 2 column 20" in answer["message"], answer


def test_a_body_without_content_type_is_read_as_json(conn):
    """Decision: no Content-Type means JSON (the one body type served), as curl --data-binary
    without -H and hand-written clients send it; FastAPI's answer here varies by version."""
    status, _, answer = conn.post("/v1/rerank", json.dumps(GOOD).encode(), content_type=None)
    assert status == 200, answer
    assert answer["results"][0]["index"] == 0


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
def test_a_body_of_another_content_type_is_415_naming_it(conn, content_type):
    status, _, answer = conn.post("/v1/rerank", json.dumps(GOOD).encode(), content_type)
    assert status == 415, answer
    assert answer["error"] == "unsupported_media_type"
    assert _fields(answer) == ["content-type"]
    assert "application/json" in answer["message"], answer


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "application/vnd.api+json", "APPLICATION/JSON"],
)
def test_json_content_types_are_accepted(conn, content_type):
    status, _, answer = conn.post("/v1/rerank", json.dumps(GOOD).encode(), content_type)
    assert status == 200, answer


def test_a_utf8_byte_order_mark_is_ignored(conn):
    status, _, answer = conn.post("/v1/rerank", b"\xef\xbb\xbf" + json.dumps(GOOD).encode())
    assert status == 200, answer
