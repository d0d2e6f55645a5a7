"""Deterministic stand-ins for the engine side of the API: a reranker, a retriever, a prior store.

Their scores are simple enough to compute by hand in the tests (word overlap), and they record the
calls the batcher makes. `slow_reranker` is also loaded by a real uvicorn subprocess through the
`module:factory` reranker kind (with this folder on PYTHONPATH).
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from cisrank.data.types import SearchHit
from cisrank.rerank.base import BaseReranker
from cisrank.serving.config import RerankerSpec, ServerConfig

_WORD = re.compile(r"\w+")

FUZZ_CLIENT_TIMEOUT_S = 600.0
"""The read timeout of schemathesis' in-process client (`case.call(timeout=...)`). Its default is
10 s, after which the client cancels the app's task: the app rightly answers that 503
`shutting_down` (a server stopping is the only thing that cancels a request in production), and
on a loaded CI host a first request has taken that long. The fuzzing checks answers, not speed."""


def overlap(query: str, passage: str) -> float:
    """The reference score: shared distinct words, plus a small length term to break ties."""
    q = set(_WORD.findall(query.lower()))
    p = set(_WORD.findall(passage.lower()))
    return float(len(q & p)) + len(passage) / 1000.0


class OverlapReranker(BaseReranker):
    """Scores by `overlap`; records every `score` call; can be held at a gate or slowed down."""

    name = "overlap"

    def __init__(self, model_name: str = "overlap-v1", delay: float = 0.0) -> None:
        self.model_name = model_name
        self.delay = delay
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.gate: threading.Event | None = None
        self.started = threading.Event()
        self.fail_on: str | None = None
        # A passage containing `poison` makes the model raise ValueError, as a tokenizer does on
        # text it cannot encode: the whole model call fails, whoever else shares it.
        self.poison: str | None = None
        # Model time proportional to work, like a real model: seconds per passage character.
        self.seconds_per_char = 0.0

    def _enter(self, requests: Sequence[tuple[str, Sequence[str]]]) -> None:
        """What every model call does first: signal, wait at the gate, sleep, maybe fail."""
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.delay:
            time.sleep(self.delay)
        if self.seconds_per_char:
            time.sleep(self.seconds_per_char * sum(len(p) for _, ps in requests for p in ps))
        for query, passages in requests:
            if self.fail_on is not None and query == self.fail_on:
                raise RuntimeError("boom")
            if self.poison is not None and any(self.poison in p for p in passages):
                raise ValueError(f"cannot encode a passage holding {self.poison!r}")

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        self._enter([(query, passages)])
        self.calls.append((query, tuple(passages)))
        return [overlap(query, p) for p in passages]

    def score_batch(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        """One `score` call per request: a reranker that cannot share batches across queries."""
        return [self.score(q, p) for q, p in requests]


class MultiOverlapReranker(OverlapReranker):
    """Also implements `score_batch`: one call per model batch, whatever the number of requests."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[list[tuple[str, tuple[str, ...]]]] = []

    def score_batch(self, requests):
        self.batches.append([(q, tuple(p)) for q, p in requests])
        self._enter(requests)
        return [[overlap(q, p) for p in ps] for q, ps in requests]


class FakePriorStore:
    def __init__(self, hits: int, misses: int) -> None:
        self._stats = {"hits": hits, "misses": misses}

    def stats(self) -> dict[str, int]:
        return dict(self._stats)


class ListRetriever:
    """Brute-force search over a small in-memory corpus by `overlap` (best first, docid ties)."""

    name = "list"
    docs = None  # no document store (the `Retriever` contract declares it)

    def __init__(self, corpus: dict[str, str]) -> None:
        self.corpus = corpus

    def search(self, query: str, k: int = 10) -> list[SearchHit]:
        ranked = sorted(self.corpus.items(), key=lambda kv: (-overlap(query, kv[1]), kv[0]))
        return [SearchHit(docid, overlap(query, text), text) for docid, text in ranked[:k]]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[SearchHit]]:
        return [self.search(q, k) for q in queries]


def slow_reranker(
    model: str | None = None,
    delay: float = 1.0,
    marker: str | None = None,
    gate: str | None = None,
):
    """Factory for a uvicorn subprocess: an OverlapReranker that takes `delay` s per call and
    touches `marker` when a call starts (so a test knows the request is in flight); with `gate`,
    calls wait (up to 30 s) until that file exists, so a test can queue requests first."""

    class _Slow(OverlapReranker):
        def score(self, query, passages):
            if marker:
                Path(marker).write_text(query, encoding="utf-8")
            deadline = time.monotonic() + 30
            while gate and not Path(gate).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return super().score(query, passages)

    return _Slow(model or "slow", delay=delay)


SLOW_LOAD_ENV = "API_FAKES_SLOW_LOAD"
"""A file path: while that file exists, `restart_slow_reranker` takes 3 s to load."""


def restart_slow_reranker(model: str | None = None, **options):
    """Factory for a `cisrank serve --workers N` subprocess: loads at once, or in 3 s while the
    file named by `API_FAKES_SLOW_LOAD` exists (a test creates it before killing a worker, so
    that the worker started in its place is still loading while the other serves); the slow
    load writes `<file>.loading` as it starts and `<file>.loaded` as it ends."""
    import os

    marker = os.environ.get(SLOW_LOAD_ENV)
    if marker and Path(marker).exists():
        Path(marker + ".loading").touch()
        time.sleep(3)
        Path(marker + ".loaded").touch()
    return OverlapReranker(model or "overlap-v1")


def config_for(names, **changes) -> ServerConfig:
    """A ServerConfig naming `names` (the rerankers are passed to create_app ready-made)."""
    specs = {n: RerankerSpec(kind="dense", model=f"model-{n}") for n in names}
    return ServerConfig(rerankers=specs, **changes)


def broken_reranker(model: str | None = None, **options):
    """Factory for a uvicorn subprocess: a model whose weights cannot be read."""
    raise OSError(f"cannot read the weights of '{model or 'broken'}': the file is truncated")


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
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
