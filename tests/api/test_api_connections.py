"""What a connection may send before its request reaches the app: a head of bounded size and line
count (431), a head deadline (408), a connection cap below the descriptor limit (503 + Retry-After
at once), and no server thread dying of EMFILE. Raw sockets against a real `cisrank serve` (the
wiring) and an in-process uvicorn with the guarded protocol (the rules, with small limits)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import socket
import threading
import time
from pathlib import Path

import pytest
from serve_process import ServeProcess

from cisrank.api.http_protocol import (
    accept_backlog,
    connection_cap,
)


def _read(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes (b"" if it reset the connection first)."""
    sock.settimeout(timeout)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _status(raw: bytes) -> int | None:
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else None


def _json(raw: bytes) -> dict:
    return json.loads(raw.partition(b"\r\n\r\n")[2])


def _send(port: int, payload: bytes) -> bytes:
    """`payload` on a fresh connection, then what the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # refused mid-send: the answer (if any) is in the receive buffer
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(payload)
        return _read(sock)


def _get(port: int, extra: bytes = b"", path: bytes = b"/healthz") -> bytes:
    head = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"Connection: close\r\n\r\n"
    return _send(port, head)


# ------------------------------------------------------------------ the real `cisrank serve`


def _cisrank_serve(log: Path, descriptors: int | None = None) -> ServeProcess:
    """A real `cisrank serve` of a weightless reranker; with `descriptors`, its soft limit on
    open files lowered to that."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def lower() -> None:
        if descriptors is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, hard))

    return ServeProcess("-r", "api_fakes:slow_reranker", log=log, preexec_fn=lower)


def test_serve_refuses_a_huge_header_and_too_many_header_lines_with_431(tmp_path):
    """A 16 MiB header was read whole and answered 200 (128 MiB ones took a server from 711
    to 1,055 MB, 45 s of CPU for two); 300 header lines were served too. Now 431 with the JSON
    body (or, for the huge one, a connection closed before it is all sent), and the server is
    unharmed."""
    with _cisrank_serve(tmp_path / "serve.log") as served:
        port = served.port
        huge = _get(port, b"X-Big: " + b"a" * (16 << 20) + b"\r\n")
        assert _status(huge) in (431, None), huge[:200]
        assert _status(huge) != 200
        big = _get(port, b"X-Big: " + b"a" * (40 << 10) + b"\r\n")  # over the 32 KiB default
        assert _status(big) == 431, big[:300]
        assert _json(big)["fields"][0]["field"] == "headers"
        assert "32768 bytes" in _json(big)["message"]
        many = _get(port, b"".join(b"X-%d: v\r\n" % i for i in range(300)))
        assert _status(many) == 431, many[:300]
        assert "302 header lines" in _json(many)["message"]  # with Host and Connection
        fine = _get(port, b"".join(b"X-%d: v\r\n" % i for i in range(90)))
        assert _status(fine) == 200, fine[:300]
        assert served.stop() == 0


def test_serve_caps_its_connections_below_the_descriptor_limit(tmp_path):
    """With 256 descriptors, 400 connections that each send half a head: the server keeps at
    most what its descriptors allow (256 - 64 backlog - 128 kept = 64), answers every other one
    503 + Retry-After at once and closes it, no thread of it dies of EMFILE, and it serves a
    fresh client as soon as the flood is gone. Before, connections were accepted until accept()
    failed with EMFILE, the flood was never answered, and `cisrank-load-watch` died."""
    with _cisrank_serve(tmp_path / "serve.log", descriptors=256) as served:
        port = served.port
        held, statuses = [], []
        for _ in range(400):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            except OSError as exc:  # the client's own limit, not the server's
                assert exc.errno != errno.ECONNREFUSED, exc
                break
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
            held.append(sock)
        time.sleep(0.5)
        for sock in held:
            sock.setblocking(False)
            try:
                answer = sock.recv(65536)
            except BlockingIOError:
                answer = None  # still held by the server: no answer yet
            except ConnectionResetError:
                answer = b""
            statuses.append(_status(answer) if answer else answer)
        refused = [s for s in statuses if s == 503]
        waiting = statuses.count(None)
        assert 0 < waiting <= connection_cap(None, 256) == 64, statuses
        assert len(refused) >= len(held) - 64 - 5, statuses  # a few may be closed, not told
        for sock in held:
            sock.close()
        time.sleep(0.5)
        assert _status(_get(port)) == 200
        assert served.stop() == 0
        err = served.output()
        assert "Exception in thread" not in err and "Too many open files" not in err, err[-3000:]
        assert "out of system resource" not in err, err[-3000:]


def test_the_cap_leaves_the_backlog_and_reserved_descriptors_free():
    assert accept_backlog(1024) == 128 and accept_backlog(20_000) == 2048
    assert connection_cap(None, 1024) == 1024 - 128 - 128
    assert connection_cap(None, 20_000) == 20_000 - 2048 - 128
    assert connection_cap(50, 20_000) == 50
    assert connection_cap(10**6, 20_000) == 20_000 - 2048 - 128


def test_the_load_watch_survives_a_moment_without_descriptors(tmp_path, monkeypatch, capsys):
    """The watch's listdir failed with EMFILE under the flood and the thread died: the ready
    line, and stopping on a worker's failure, were lost. A failed look is tried again."""
    from cisrank.cli import serve

    failures = {"left": 5}
    real = os.listdir

    def listdir(path):
        if failures["left"]:
            failures["left"] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path)

    monkeypatch.setattr(serve.os, "listdir", listdir)
    stopped = threading.Event()
    watch = serve.LoadWatch(tmp_path, 1, "http://127.0.0.1:1", stopped.set)
    watch.start()
    (tmp_path / "ready-1").write_text("")
    deadline = time.monotonic() + 10
    while "ready on" not in capsys.readouterr().err and time.monotonic() < deadline:
        assert watch.is_alive(), "the watch died"
        time.sleep(0.05)
    assert watch.is_alive() and failures["left"] == 0
    (tmp_path / "failed-2").write_text("reranker 'x' failed to load")
    watch.join(5)
    assert stopped.is_set() and watch.failure == "reranker 'x' failed to load"


# ------------------------------------------------------------------ the rules, in-process


class _Echo:
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        body = json.dumps({"headers": len(scope["headers"])}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def guarded(guarded_app):
    """`guarded(**limits)` -> the port of an in-process uvicorn with the guarded protocol."""
    return lambda **limits: guarded_app(_Echo(), lifespan="off", **limits)


def test_a_stalled_head_gets_408_and_an_idle_connection_is_closed(guarded):
    port = guarded(header_timeout_s=0.3)
    with socket.create_connection(("127.0.0.1", port)) as stalled:
        stalled.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: tr")
        started = time.monotonic()
        answer = _read(stalled)
        assert _status(answer) == 408 and _json(answer)["error"] == "request_timeout", answer
        assert 0.25 < time.monotonic() - started < 3
    with socket.create_connection(("127.0.0.1", port)) as idle:
        assert _read(idle) == b""  # closed, nothing said: it asked nothing
    assert _status(_get(port)) == 200  # a head sent at once is served


def test_the_deadline_and_limits_hold_for_every_request_of_a_kept_alive_connection(guarded):
    port = guarded(header_timeout_s=0.5, max_header_bytes=4096, max_headers=20)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(5)
        for _ in range(3):
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            head = conn.recv(65536)
            assert _status(head) == 200, head
            time.sleep(0.3)  # each head has its own deadline: three of them outlast one
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: v\r\n" * 30 + b"\r\n")
        answer = _read(conn)
        assert _status(answer) == 431 and "31 header lines" in _json(answer)["message"]
    # a head over the byte limit sent in pieces is refused once it is over, before it ends
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        for _ in range(5):
            conn.sendall(b"a" * 1024)
            time.sleep(0.02)
        answer = _read(conn)
        assert _status(answer) == 431 and "over 4096 bytes" in _json(answer)["message"]


def test_connections_over_the_cap_get_503_with_retry_after_at_once(guarded):
    port = guarded(max_connections=3, retry_after_s=2, header_timeout_s=30)
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port)) as extra:
            answer = _read(extra, timeout=5)
        assert _status(answer) == 503, answer
        assert b"\r\nretry-after: 2\r\n" in answer and _json(answer)["error"] == "overloaded"
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert _status(_get(port)) == 200  # the held ones are gone: served again
