"""Slow and vanishing clients over raw sockets against a real uvicorn server.

A client that sends its headers and part of its body, then stalls (or trickles a byte now and
then), gets 408 with the JSON error body once `limits.body_read_timeout_s` has passed since its
headers, and its connection is closed. A client that hangs up mid-body is counted as a client
abort in /metrics (`cisrank_client_aborts_total`, status 499), never as a 5xx.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from api_fakes import OverlapReranker, config_for

from cisrank.api.app import create_app
from cisrank.serving.config import Limits

TIMEOUT_S = 0.5
BODY = json.dumps({"query": "who wrote hamlet", "documents": ["Shakespeare wrote Hamlet."] * 4})


class _Arrivals:
    """An ASGI wrapper counting the HTTP requests that reached the app (headers parsed)."""

    def __init__(self, app) -> None:
        self.app = app
        self.count = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            self.count += 1
        await self.app(scope, receive, send)


@contextmanager
def _serving(body_read_timeout_s: float) -> Iterator[tuple[int, _Arrivals]]:
    """uvicorn serving the app on 127.0.0.1 in a thread: the real HTTP stack, no subprocess."""
    config = config_for(["overlap"], limits=Limits(body_read_timeout_s=body_read_timeout_s))
    arrivals = _Arrivals(create_app(config, rerankers={"overlap": OverlapReranker()}, api_keys=()))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(arrivals, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    try:
        yield sock.getsockname()[1], arrivals
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def live():
    """A server with a short body deadline (TIMEOUT_S)."""
    with _serving(TIMEOUT_S) as (port, _):
        yield port


@pytest.fixture(scope="module")
def patient():
    """A server whose body deadline (30 s) cannot fire during a test: hang-ups stay hang-ups."""
    with _serving(30.0) as served:
        yield served


def _half_sent(port: int, sent: int = 10) -> socket.socket:
    """A connection that sent the headers of a /v1/rerank and the first `sent` bytes of its body."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    head = (
        "POST /v1/rerank HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n"
    )
    s.sendall(head.encode() + BODY[:sent].encode())
    return s


def _read_to_close(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket timeout: 5 s)."""
    chunks = []
    while chunk := s.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, json.loads(body)


def _metric(port: int, name: str) -> dict[str, float]:
    """`{labels: value}` of one metric family from /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {m[0]: float(m[1]) for m in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M)}


def _server_errors(port: int) -> float:
    counts = _metric(port, "cisrank_requests_total")
    return sum(v for labels, v in counts.items() if re.search(r'status="5\d\d"', labels))


def _assert_408(raw: bytes) -> None:
    status, headers, body = _parse(raw)
    assert status == 408, raw
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert body["error"] == "request_timeout"
    assert f"within {TIMEOUT_S:g} s" in body["message"]
    assert [f["field"] for f in body["fields"]] == ["body"]


def test_half_sent_bodies_get_408_json_and_the_connection_closed(live):
    conns = [_half_sent(live) for _ in range(16)]
    started = time.monotonic()
    answers = [_read_to_close(s) for s in conns]  # ends only when the server closes each one
    elapsed = time.monotonic() - started
    for s in conns:
        s.close()
    for raw in answers:
        _assert_408(raw)
    assert TIMEOUT_S * 0.8 <= elapsed < TIMEOUT_S + 3, elapsed
    # the server still answers, and counted the 408s as client errors, not 5xx
    assert _metric(live, "cisrank_requests_total")['route="/v1/rerank",status="408"'] >= 16
    ok = httpx.post(f"http://127.0.0.1:{live}/v1/rerank", json=json.loads(BODY), timeout=10)
    assert ok.status_code == 200 and len(ok.json()["results"]) == 4


def test_a_trickling_body_gets_408_at_the_deadline_not_per_chunk(live):
    s = _half_sent(live, sent=1)
    started = time.monotonic()
    for i in range(2, 12):  # a byte every 0.1 s: never idle long, never done
        time.sleep(0.1)
        try:
            s.sendall(BODY[i - 1 : i].encode())
        except OSError:  # closed by the server after its 408
            break
    raw = _read_to_close(s)
    s.close()
    _assert_408(raw)
    assert time.monotonic() - started < TIMEOUT_S + 2


def test_clients_that_hang_up_mid_body_are_aborts_not_server_errors(patient):
    live, arrivals = patient
    errors_before = _server_errors(live)
    aborts = _metric(live, "cisrank_client_aborts_total")
    before = aborts.get('route="/v1/rerank"', 0.0)
    arrived = arrivals.count
    conns = [_half_sent(live) for _ in range(10)]
    deadline = time.monotonic() + 10
    while arrivals.count - arrived < 10 and time.monotonic() < deadline:
        time.sleep(0.01)  # every request reached the app before its client hangs up
    assert arrivals.count - arrived == 10
    for s in conns:
        s.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the server has counted the 10 hang-ups somehow
        now = _metric(live, "cisrank_client_aborts_total").get('route="/v1/rerank"', 0.0)
        if now - before >= 10 or _server_errors(live) - errors_before >= 10:
            break
        time.sleep(0.05)
    assert _server_errors(live) == errors_before
    assert now - before == 10
    counts = _metric(live, "cisrank_requests_total")
    assert counts['route="/v1/rerank",status="499"'] >= 10
