"""A hostile client against a real uvicorn (issue 61): what it costs others, measured on loopback
with raw sockets and small loads.

- No key, no budget: a client without a valid key is answered 401 from its request head, and
  the bytes its head declares are never reserved, so clients with a key keep being served.
"""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import httpx
from api_fakes import OverlapReranker, config_for

from cisrank.api.app import create_app
from cisrank.serving.config import BatchingConfig, Limits

KEY = "hostile-test-key-0123"
DOCS = ["word " * 6000] * 3  # 90,000 characters
BODY = json.dumps({"query": "word", "documents": DOCS}).encode()  # 90,042 bytes


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one HTTP/1.1 response with a Content-Length."""
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before a response: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    while len(rest) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest


def _address(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    assert parsed.hostname is not None and parsed.port is not None
    return parsed.hostname, parsed.port


def test_clients_without_a_key_get_401_from_the_head_and_reserve_no_body_budget(live_server):
    """Before: 17 sockets declaring 16 MB each (and sending 100 bytes) held the 256 MiB budget
    for 30 s and every client with a key got 503 `overloaded`. Scaled down here: a budget of
    250 KB, three sockets without a key declaring 90 KB each (270 KB)."""
    cfg = config_for(
        ["ov"],
        limits=Limits(
            max_body_bytes=100_000, max_inflight_body_bytes=250_000, body_read_timeout_s=20
        ),
        batching=BatchingConfig(max_wait_ms=0, retry_after_s=3),
    )
    app = create_app(cfg, rerankers={"ov": OverlapReranker()}, api_keys=[KEY])
    host, port = _address(live_server(app))
    head = (
        f"POST /v1/rerank HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n"
    )
    attackers = []
    try:
        for auth in ("", "Authorization: Bearer wrong-key\r\n", "Authorization: Basic x\r\n"):
            sock = socket.create_connection((host, port))
            attackers.append(sock)
            sock.sendall((head + auth + "\r\n").encode() + BODY[:100])
            # answered from the head: 90 KB declared, 100 bytes sent, the 401 is already there
            status, headers, body = _read_response(sock)
            assert status == 401, body
            assert headers["www-authenticate"] == "Bearer"
            assert headers["connection"] == "close"
            error = json.loads(body)
            assert error["error"] == "unauthorized"
            assert error["fields"][0]["field"] == "authorization"
        # the three still hold their connections: clients with the key are served meanwhile
        auth = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
        url = f"http://{host}:{port}/v1/rerank"
        for _ in range(2):
            r = httpx.post(url, content=BODY, headers=auth, timeout=10)
            assert r.status_code == 200, r.text
        # probes stay open, and an unknown path without a key is 401, not 404
        assert httpx.get(f"http://{host}:{port}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"http://{host}:{port}/nothing", timeout=5).status_code == 401
        assert httpx.get(f"http://{host}:{port}/nothing", headers=auth).status_code == 404
    finally:
        for sock in attackers:
            sock.close()
    # an attacker that sends its whole body reads its 401 to the end, and the connection closes
    with socket.create_connection((host, port)) as sock:
        sock.sendall((head + "\r\n").encode() + BODY)
        started = time.monotonic()
        data = b""
        sock.settimeout(5)
        while chunk := sock.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 401 ") and time.monotonic() - started < 3


def test_a_trailing_slash_is_served_never_redirected_to_the_host_header(make_client):
    """Before: `POST /v1/rerank/` with `Host: evil.example` answered 307 with `location:
    http://evil.example/v1/rerank`."""
    client = make_client({"ov": OverlapReranker()}, api_keys=[KEY])
    client.follow_redirects = False
    evil = {"host": "evil.example", "authorization": f"Bearer {KEY}"}
    body = {"query": "hamlet", "documents": ["hamlet", "paris"]}
    for path in ("/v1/rerank/", "/v1/rerank//", "/rerank/"):
        r = client.post(path, json=body, headers=evil)
        assert r.status_code == 200, (path, r.status_code, r.headers)
        assert "location" not in r.headers
        assert [x["index"] for x in r.json()["results"]] == [0, 1]
    assert client.get("/healthz/", headers={"host": "evil.example"}).status_code == 200
    r = client.get("/v1/models/", headers=evil)
    assert r.status_code == 200 and r.json()["default"] == "ov"
    # without the key a trailing slash is refused like the path itself; an unknown one is 404
    assert (
        client.post("/v1/rerank/", json=body, headers={"host": "evil.example"}).status_code == 401
    )
    r = client.post("/v1/nothing/", json=body, headers=evil)
    assert r.status_code == 404 and "location" not in r.headers
