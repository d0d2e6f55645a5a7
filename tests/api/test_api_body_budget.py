"""Admission control on request-body bytes, through a real uvicorn with raw sockets: once the bodies
in flight would pass `max_inflight_body_bytes`, the next request gets 503 + Retry-After with the
JSON error body, before its body is read: a declared one is refused with not a byte of it sent, a
chunked one after the chunk that went over, unterminated."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import httpx
from api_fakes import OverlapReranker, config_for, read_response

from cisrank.api.app import create_app
from cisrank.serving.config import BatchingConfig, Limits

DOCS = ["word " * 6000] * 3  # 90,000 characters
BODY = json.dumps({"query": "word", "documents": DOCS}).encode()  # 90,042 bytes


def _head(path: str, extra: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{extra}\r\n"
    ).encode()


def test_bodies_over_the_inflight_budget_get_503_before_they_are_read(live_server):
    reranker = OverlapReranker()
    reranker.gate = threading.Event()
    cfg = config_for(
        ["ov"],
        limits=Limits(max_body_bytes=100_000, max_inflight_body_bytes=250_000),
        batching=BatchingConfig(max_wait_ms=0, retry_after_s=4),
    )
    app = create_app(cfg, rerankers={"ov": reranker}, api_keys=[])
    url = live_server(app)
    host, port = urlparse(url).hostname, urlparse(url).port
    scorer = app.state.serving.scorers["ov"]

    def post() -> httpx.Response:
        headers = {"content-type": "application/json"}
        return httpx.post(url + "/v1/rerank", content=BODY, headers=headers, timeout=30)

    with ThreadPoolExecutor(2) as pool:
        # two 90 KB bodies are admitted and held (the model is stopped at the gate): 180 KB
        held = [pool.submit(post) for _ in range(2)]
        deadline = time.monotonic() + 10
        while scorer.depth < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert scorer.depth == 2

        # a third declares 90 KB: refused up front; not a byte of its body is ever sent
        with socket.create_connection((host, port)) as sock:
            sock.sendall(_head("/v1/rerank", f"Content-Length: {len(BODY)}\r\n"))
            status, headers, body = read_response(sock)
        assert status == 503, body
        assert headers["retry-after"] == "4"
        assert headers["content-type"] == "application/json"
        error = json.loads(body)
        assert error["error"] == "overloaded" and "retry later" in error["message"]

        # a chunked one is counted as it arrives: refused once 80 KB of it went over the
        # 70 KB left, although it never sent its last chunk
        with socket.create_connection((host, port)) as sock:
            sock.sendall(_head("/v1/rerank", "Transfer-Encoding: chunked\r\n"))
            piece = BODY[:10_000]
            for _ in range(8):
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            status, headers, body = read_response(sock)
        assert status == 503, body
        assert headers["retry-after"] == "4" and json.loads(body)["error"] == "overloaded"

        # requests without a body still get through while the budget is full
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200

        reranker.gate.set()
        assert [f.result().status_code for f in held] == [200, 200]

    # every reservation was given back (refused ones included): three more 90 KB bodies in a
    # row all fit, where a leak of even one would leave less than 90 KB
    for _ in range(3):
        assert post().status_code == 200
    # a body over max_body_bytes is still the body limit's 413, not a 503
    big = json.dumps({"query": "q", "documents": ["word " * 6000] * 4}).encode()
    r = httpx.post(url + "/v1/rerank", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_a_config_whose_budget_cannot_take_one_allowed_body_is_refused():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="max_inflight_body_bytes"):
        config_for(["ov"], limits=Limits(max_body_bytes=100_000, max_inflight_body_bytes=50_000))
    with pytest.raises(ValidationError, match="max_inflight_cost"):
        config_for(
            ["ov"],
            limits=Limits(max_request_cost=1000),
            batching=BatchingConfig(max_inflight_cost=999),
        )


def _post_whole_body(host: str, port: int, body: bytes, chunked: bool) -> tuple[int, dict, bytes]:
    """A client as most HTTP libraries are: the whole body sent first (with a Content-Length,
    or chunked in pieces of 64 KiB), then the answer read to the end of the connection.
    (0, {}, error) when the connection failed instead."""
    if chunked:
        pieces = [body[i : i + 65536] for i in range(0, len(body), 65536)]
        head = _head("/v1/rerank", "Transfer-Encoding: chunked\r\n")
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    else:
        head = _head("/v1/rerank", f"Content-Length: {len(body)}\r\n")
        payload = body
    try:
        with socket.create_connection((host, port), timeout=30) as sock:
            sock.sendall(head + payload)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError as exc:
        return 0, {}, repr(exc).encode()
    if not data:
        return 0, {}, b"closed with no response"
    head_part, _, rest = data.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


def test_every_client_refused_by_the_budget_reads_its_503(live_server):
    """The early 503 was sent and the connection closed with the body unread, which resets it and
    discards the answer: 47 of 64 concurrent 15 MB uploads saw no response. The rest of a refused
    body is now read and dropped (never held) before closing."""
    cap = 8 * 1024 * 1024
    cfg = config_for(
        ["ov"],
        limits=Limits(max_body_bytes=cap, max_inflight_body_bytes=cap, body_read_timeout_s=20),
        batching=BatchingConfig(max_wait_ms=0, retry_after_s=2),
    )
    url = live_server(create_app(cfg, rerankers={"ov": OverlapReranker()}, api_keys=[]))
    host, port = urlparse(url).hostname, urlparse(url).port
    assert host is not None and port is not None
    # a stalled upload declares the whole budget: every other body is refused up front
    holder = socket.create_connection((host, port))
    holder.sendall(_head("/v1/rerank", f"Content-Length: {cap}\r\n") + b'{"query": ')
    time.sleep(0.5)
    body = json.dumps({"query": "word", "documents": ["word " * 6000] * 200}).encode()  # 6 MB
    try:
        with ThreadPoolExecutor(8) as pool:
            # Content-Length and chunked alike (clients once lost the answer with both)
            sent = [i % 2 == 1 for i in range(8)]
            answers = list(pool.map(lambda c: _post_whole_body(host, port, body, c), sent))
        for chunked, (status, headers, rest) in zip(sent, answers, strict=True):
            assert status == 503, (chunked, rest[:300])
            assert headers["retry-after"] == "2" and headers["connection"] == "close"
            assert json.loads(rest)["error"] == "overloaded"
        # a client that waits for 100-continue never sends its body: answered and closed at once
        started = time.monotonic()
        with socket.create_connection((host, port), timeout=10) as sock:
            extra = f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n"
            sock.sendall(_head("/v1/rerank", extra))
            data = b""
            while chunk := sock.recv(65536):  # to the end: the server closes the connection
                data += chunk
        assert data.startswith(b"HTTP/1.1 503 "), data[:200]
        assert b"100 Continue" not in data and time.monotonic() - started < 5
    finally:
        holder.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the held bytes are given back once the holder is gone
        r = httpx.post(url + "/v1/rerank", json={"query": "q", "documents": ["q"]}, timeout=10)
        if r.status_code == 200:
            break
        time.sleep(0.1)
    assert r.status_code == 200, r.text


def _upload(host: str, port: int, body: bytes, chunked: bool, go: threading.Barrier):
    """One client sending `body` in 16 KiB pieces a few milliseconds apart (so that concurrent
    uploads interleave, as over a real network), chunked or with a Content-Length; then the
    answer read to the end."""
    pieces = [body[i : i + 16384] for i in range(0, len(body), 16384)]
    if chunked:
        head = _head("/v1/rerank", "Transfer-Encoding: chunked\r\nConnection: close\r\n")
        frames = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]
    else:
        head = _head("/v1/rerank", f"Content-Length: {len(body)}\r\nConnection: close\r\n")
        frames = pieces
    with socket.create_connection((host, port), timeout=30) as sock:
        go.wait()
        sock.sendall(head)
        try:
            for frame in frames:
                sock.sendall(frame)
                time.sleep(0.003)
        except OSError:
            pass  # refused mid-body: the answer is waiting
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    head_part, _, rest = data.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1.1 "):
        return 0, {}, data
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


def test_chunked_bodies_are_admitted_as_bodies_with_a_content_length_are(live_server):
    """Before, 24 concurrent chunked 15 MB bodies got 0 answers where 16 of 24 with a Content-Length
    were served (64: 0 of 64): each chunked body held part of the budget and each was refused at its
    next chunk. Now an older chunked body takes the bytes of younger ones: 8 concurrent 300 KB
    uploads against a 1 MiB budget serve as many chunked as sized (3), and every other client reads
    503 + Retry-After."""
    reranker = OverlapReranker(delay=0.5)  # the served hold their bytes while the rest arrive
    cfg = config_for(
        ["ov"],
        limits=Limits(
            max_body_bytes=400_000, max_inflight_body_bytes=1 << 20, body_read_timeout_s=20
        ),
        batching=BatchingConfig(max_wait_ms=0, retry_after_s=3, max_batch_tokens=10**6),
    )
    url = live_server(create_app(cfg, rerankers={"ov": reranker}, api_keys=[]))
    host, port = urlparse(url).hostname, urlparse(url).port
    assert host is not None and port is not None
    body = json.dumps({"query": "word", "documents": ["word " * 6000] * 10}).encode()  # 300 KB
    served = {}
    for chunked in (False, True):
        go = threading.Barrier(8)
        with ThreadPoolExecutor(8) as pool:
            clients = [pool.submit(_upload, host, port, body, chunked, go) for _ in range(8)]
            answers = [client.result() for client in clients]
        statuses = [status for status, _, _ in answers]
        served[chunked] = statuses.count(200)
        for status, headers, rest in answers:
            if status != 200:
                assert status == 503, (chunked, statuses, rest[:300])
                assert headers["retry-after"] == "3" and json.loads(rest)["error"] == "overloaded"
        time.sleep(0.5)
    assert served[False] == 3, served  # 3 x 300 KB fit 1 MiB
    assert served[True] >= served[False], served
