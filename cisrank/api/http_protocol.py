"""The HTTP connection as `cisrank serve` reads it: a bounded request head, a head deadline and a
bounded number of connections (docs/reliability.md, "Bounds").

Why a protocol of our own: uvicorn's default parser (httptools) reads a request's head without
any limit. A 128 MiB header was read whole (httptools joins the pieces of a header value one
concatenation at a time: 45 s of CPU for two of them) and answered 200; the server went from 711
to 1,055 MB. Nothing times out a connection between its first byte and the end of its head, and
every connection holds a file descriptor: 20,200 connections that each sent half a head filled
all 20,000 descriptors, fresh clients got no connection, and the thread that watches the
workers' loading died of EMFILE. uvicorn's `limit_concurrency` answers 503 only once a head is
complete, after the descriptor is taken, and h11's `max_incomplete_event_size` (the one head limit
uvicorn has) is for h11 alone, answered 400.

`GuardedHttpToolsProtocol` is uvicorn's httptools protocol with, per `ConnectionLimits`:

- a head (request line and headers) of at most `max_header_bytes` and `max_headers` header
  lines: a larger one is answered 431 (Request Header Fields Too Large, RFC 6585) with the JSON
  error body and the connection closed, having read at most the limit and one read (256 KiB) of
  it, and never handed to the app;
- a head deadline: a head not complete `header_timeout_s` after the connection opened (or after
  the first byte of a following request on a kept-alive connection) is answered 408 and closed;
  a connection that sent nothing by then is closed (what uvicorn does to an idle kept-alive one);
- at most `max_connections` open connections per process, set below the descriptor limit: one
  over it is answered 503 with Retry-After at once and closed, so its descriptor is back within
  the same event-loop turn and the process never runs out of descriptors (the model, prior store
  and index files, the loader and the load watch keep theirs).

Pipelined requests (several in one read) are each held to these limits alone: a head counts the
bytes from where it began, never those of the requests before it in the same read (302 complete
requests of 99 bytes in one read were refused 431 as one head of 32 KB, none answered). A head
refused behind requests still being answered is answered after them, in order. A client that
hangs up while its pipelined requests are answered is one log line, and each request it left
unanswered counts as a client abort (499) in the metrics: uvicorn marks only the connection's
newest request as disconnected, so the one being answered wrote to the closed transport, which
was an ERROR with two tracebacks and a request counted 200.

Responses are bounded here too (`_bounded_send`): a body is written in `SEND_SLICE` pieces, each
waiting for the transport to drain; a body over a slice reserves its bytes from a budget per
process (`limits.max_inflight_response_bytes`), and one that does not fit is answered 503 +
Retry-After instead; a client that takes in no slice for `limits.response_send_timeout_s` is cut
(a client abort). uvicorn waited only before a body message, so 32 clients that never read an
8 MB answer held 306 MB for as long as they stayed.

No limit here applies to request bodies: those are the app's (`cisrank.api.middleware`,
`cisrank.api.lifecycle`). Where httptools is not installed, `cisrank serve` falls back to h11 with
`h11_max_incomplete_event_size` (heads over it: 400), without the deadline, the connection cap or
the response bounds.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cisrank.api.middleware import CLIENT_GONE, ByteBudget, ClientGone
from cisrank.api.schemas import ErrorBody, FieldError
from cisrank.serving.config import ServerConfig

log = logging.getLogger(__name__)

PARSE_SLICE = 8 * 1024
"""Bytes of a read handed to the parser at a time (see `GuardedHttpToolsProtocol.data_received`)."""

RESERVED_DESCRIPTORS = 128
"""Descriptors kept free of connections for everything else a server process opens (model,
tokenizer, prior store, index and log files, worker pipes, the status folder)."""


def descriptor_limit() -> int:
    """This process's soft limit on open descriptors (RLIMIT_NOFILE); 1,048,576 if unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)


def accept_backlog(descriptors: int | None = None) -> int:
    """The listen backlog: asyncio accepts up to this many pending connections in one go before
    any of them is refused, so it counts against the descriptors too (an eighth of them, 64 to
    2,048, uvicorn's default)."""
    descriptors = descriptor_limit() if descriptors is None else descriptors
    return max(64, min(2048, descriptors // 8))


def connection_cap(requested: int | None, descriptors: int | None = None) -> int:
    """Connections one process may hold: `requested` (`limits.max_connections`), at most the
    descriptor limit less the accept backlog and `RESERVED_DESCRIPTORS` (what it is when not
    requested). A request above that is lowered to it, with a warning."""
    descriptors = descriptor_limit() if descriptors is None else descriptors
    room = max(1, descriptors - accept_backlog(descriptors) - RESERVED_DESCRIPTORS)
    if requested is None:
        return room
    if requested > room:
        log.warning(
            "limits.max_connections %d is over what %d descriptors allow; serving at most %d "
            "connections (raise the descriptor limit, ulimit -n, to serve more)",
            requested,
            descriptors,
            room,
        )
    return min(requested, room)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may send before its request reaches the app (see the module doc)."""

    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    max_connections: int = 1 << 20
    retry_after_s: int = 1
    max_inflight_response_bytes: int = 256 * 1024 * 1024
    response_send_timeout_s: float = 30.0

    @classmethod
    def from_config(cls, config: ServerConfig) -> ConnectionLimits:
        limits = config.limits
        return cls(
            max_header_bytes=limits.max_header_bytes,
            max_headers=limits.max_headers,
            header_timeout_s=limits.header_timeout_s,
            max_connections=connection_cap(limits.max_connections),
            retry_after_s=config.batching.retry_after_s,
            max_inflight_response_bytes=limits.max_inflight_response_bytes,
            response_send_timeout_s=limits.response_send_timeout_s,
        )


SEND_SLICE = 64 * 1024
"""Bytes of a response body written at a time: each slice waits for the transport to drain
(uvicorn waits only before a body message, and one message held the whole answer), so a client
that does not read holds at most a slice and the transport's high-water mark in its buffers."""


class ResponseBudget(ByteBudget):
    """Bytes of response bodies over `SEND_SLICE` that this process holds while their clients
    read them. One per process and limit (every connection of a process has the same limits)."""


_budgets: dict[int, ResponseBudget] = {}


def response_budget(limit: int) -> ResponseBudget:
    """This process's response budget of `limit` bytes."""
    return _budgets.setdefault(limit, ResponseBudget(limit))


@functools.lru_cache(maxsize=1)
def _default_limits() -> ConnectionLimits:
    """The limits of a default config, for a protocol built without any."""
    return ConnectionLimits.from_config(ServerConfig())


def _response(status: int, reason: str, error: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 response with the JSON error body that closes the connection."""
    fields = [FieldError(field="headers", message=message, type="size")] if status == 431 else []
    body = ErrorBody(error=error, message=message, fields=fields).model_dump_json().encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class _RefusalLog:
    """One warning for a run of refused connections, at most every `every_s` seconds, with the
    count since the last: a flood of thousands must not become thousands of log lines."""

    def __init__(self, every_s: float = 10.0, what: str = "connection refused (503)") -> None:
        self.every_s = every_s
        self.what = what
        self.last = -float("inf")
        self.suppressed = 0

    def __call__(self, logger: logging.Logger, now: float, message: str) -> None:
        if now - self.last < self.every_s:
            self.suppressed += 1
            return
        more = f" (and {self.suppressed} more since the last warning)" if self.suppressed else ""
        logger.warning("%s: %s%s", self.what, message, more)
        self.last, self.suppressed = now, 0


_refusals = _RefusalLog()
_answer_refusals = _RefusalLog(what="answer refused (503)")


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded head, a head deadline and a connection cap.
    Its limits are `limits` (bound by `with_limits`), else those of a default config."""

    @classmethod
    def with_limits(cls, limits: ConnectionLimits) -> Callable[..., GuardedHttpToolsProtocol]:
        """This protocol with `limits`, for uvicorn.Config(http=...): a partial, which pickles
        (by this class's import path and the limits' values), so that every worker process of
        `cisrank serve --workers N` builds it with the same limits."""
        return functools.partial(cls, limits=limits)

    def __init__(self, *args: Any, limits: ConnectionLimits | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = limits or _default_limits()
        self._refused = False
        self._in_head = True  # reading a request's head (or waiting for the first one)
        self._head_bytes = 0  # bytes received while in the head, read by the parser or not
        self._head_size = 0  # bytes of the head's parts the parser handed over
        self._head_lines = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._begun = 0  # requests whose head began on this connection
        self._answering: set[Any] = set()  # cycles whose app runs (uvicorn tracks the newest only)
        self._refusal: bytes | None = None  # a refusal waiting for the answers before it

    # ---- refusals

    def _refuse(self, response: bytes) -> None:
        """Answer `response` and close: the parser's callbacks are ignored from now on. Behind
        requests of this connection still being answered (pipelined), it waits for them: they
        are answered first, in order, then the refusal."""
        self._refused = True
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        if self._unanswered():
            self._refusal = response
            if self.flow is not None:
                self.flow.pause_reading()
            return
        self.transport.write(response)
        self.transport.close()

    def _unanswered(self) -> bool:
        """Whether requests of this connection are being answered or wait in line."""
        return bool(self.pipeline) or any(not c.response_complete for c in self._answering)

    def _refuse_head(self, why: str) -> None:
        self.logger.warning("request head refused (431): %s", why)
        message = (
            f"{why}: at most {self.guard.max_header_bytes} bytes and {self.guard.max_headers} "
            "header lines are read"
        )
        self._refuse(_response(431, "Request Header Fields Too Large", "invalid_request", message))

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._refused or not self._in_head or self.transport.is_closing():
            return
        if not self._head_bytes:  # nothing sent: an idle connection, closed like uvicorn's
            self._refused = True
            self.transport.close()
            return
        message = (
            f"the request head did not arrive within {self.guard.header_timeout_s:g} s "
            "of the connection"
        )
        self._refuse(_response(408, "Request Timeout", "request_timeout", message))

    def _start_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self.guard.header_timeout_s, self._head_timed_out
            )

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    # ---- connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.guard.max_connections:
            self.transport = transport
            message = (
                f"the server holds {len(self.connections)} connections, its limit: retry later"
            )
            extra = f"retry-after: {self.guard.retry_after_s}\r\n"
            _refusals(self.logger, self.loop.time(), message)
            self._refuse(_response(503, "Service Unavailable", "overloaded", message, extra))
            return
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._refused and self.flow is None:  # refused in connection_made: nothing else
            return
        cut = [c for c in self._answering if not c.response_complete]
        waiting = [c for c, _ in self.pipeline]
        for cycle in [*cut, *waiting]:
            # uvicorn marks only its newest request (the last pipelined one) disconnected: the
            # one being answered would write to the closed transport
            cycle.disconnected = True
            cycle.message_event.set()
            gone = cycle.scope.get(CLIENT_GONE)
            if gone is not None:
                gone.gone = True
        self.pipeline.clear()
        if cut:
            first = cut[0].scope
            self.logger.info(
                "client hung up during the response to %s %s (%d request(s) of the connection "
                "unanswered)",
                first.get("method"),
                first.get("path"),
                len(cut) + len(waiting),
            )
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._answering.add(cycle)
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        self._answering = {c for c in self._answering if not c.response_complete}
        super().on_response_complete()
        if self._refusal is not None and not self._unanswered() and not self.transport.is_closing():
            self.transport.write(self._refusal)
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        """A read, handed to the parser in slices of at most `PARSE_SLICE` bytes, so that a
        head that begins inside a read behind other requests (pipelined) is counted from the
        next slice: at most one slice short of its size, never the whole read."""
        if len(data) <= PARSE_SLICE:
            self._parse(data)
            return
        view = memoryview(data)
        for at in range(0, len(data), PARSE_SLICE):
            if self._refused or self.transport.is_closing() or self.parser is None:
                return
            if self.transport.get_protocol() is not self:  # upgraded: not ours to parse
                return
            self._parse(bytes(view[at : at + PARSE_SLICE]))

    def _parse(self, data: bytes) -> None:
        if self._refused:
            return
        in_head = self._in_head
        begun = self._begun
        super().data_received(data)
        if self._refused or not self._in_head:
            return
        # Still inside a head: everything received since it began counts, the part of a header
        # the parser is still joining included (it hands a header over only once it is whole).
        # A head that began inside this slice behind other requests (pipelined) counts from
        # the next slice: this one's bytes are mostly the requests before it. The
        # connection's first head counts from its first byte.
        if in_head and (self._begun == begun or (begun == 0 and self._begun == 1)):
            self._head_bytes += len(data)
        if max(self._head_bytes, self._head_size) > self.guard.max_header_bytes:
            self._refuse_head(f"the request head is over {self.guard.max_header_bytes} bytes")

    # ---- parser callbacks

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._begun += 1
        if not self._in_head:  # a following request on a kept-alive connection
            self._in_head = True
            self._head_bytes = 0
        self._head_size = self._head_lines = 0
        self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        if self._refused:
            return
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_size += len(name) + len(value) + 4
        self._head_lines += 1
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._in_head = False
        self._cancel_head_timer()
        if self._head_lines > self.guard.max_headers:
            self._refuse_head(f"the request has {self._head_lines} header lines")
            return
        if self._head_size > self.guard.max_header_bytes:
            self._refuse_head(f"the request head is {self._head_size} bytes")
            return
        self.scope[CLIENT_GONE] = ClientGone()  # type: ignore[literal-required]
        super().on_headers_complete()
        if self.cycle is not None and not self._refused:
            self.cycle.send = self._bounded_send(self.cycle)  # type: ignore[assignment]

    # ---- responses: a budget of bytes in flight and a send timeout

    def _bounded_send(self, cycle: Any) -> Callable[[Any], Any]:
        """`cycle.send` with the response budget and the send timeout: a body over
        `SEND_SLICE` reserves its bytes before its head is written (503 + Retry-After when
        they do not fit), is written a slice at a time, each slice waiting at most
        `response_send_timeout_s` for the client to take in the one before (else the
        connection is cut, a client abort), and gives its bytes back once written."""
        send = cycle.send
        budget = response_budget(self.guard.max_inflight_response_bytes)
        timeout = self.guard.response_send_timeout_s
        head: dict[str, Any] | None = None
        dropped = False  # answered otherwise (503) or cut: the app's later messages go nowhere

        async def timed(message: Any) -> None:
            if self.flow is not None and self.flow.write_paused:
                try:
                    await asyncio.wait_for(self.flow.drain(), timeout)
                except TimeoutError:
                    self._cut(cycle, timeout)
                    return
            await send(message)

        async def bounded(message: Any) -> None:
            nonlocal head, dropped
            kind = message["type"]
            if dropped or cycle.disconnected:
                return
            if kind == "http.response.start" and not cycle.response_started:
                head = message  # written with the first body, once its size is known
                return
            if kind != "http.response.body":
                await send(message)
                return
            body = message.get("body", b"")
            held = len(body) if len(body) > SEND_SLICE else 0
            if head is not None:
                start, head = head, None
                if held and not budget.take(held):
                    dropped = True
                    await self._over_budget(cycle, send, budget, held)
                    return
                await send(start)
            elif held and not budget.take(held):  # a later piece of a stream: sent unreserved
                held = 0
            try:
                if not held:
                    await timed(message)
                    return
                view = memoryview(body)
                for at in range(0, len(body), SEND_SLICE):
                    if cycle.disconnected:
                        return
                    piece = bytes(view[at : at + SEND_SLICE])
                    await timed({"type": kind, "body": piece, "more_body": True})
                if not cycle.disconnected:
                    more = message.get("more_body", False)
                    await timed({"type": kind, "body": b"", "more_body": more})
            finally:
                budget.give(held)

        return bounded

    async def _over_budget(self, cycle: Any, send: Any, budget: ResponseBudget, n: int) -> None:
        """The 503 sent instead of an answer of `n` bytes the response budget cannot take."""
        message = (
            f"the server holds {budget.used} bytes of responses its clients are still reading, "
            f"its limit is {budget.limit}; this answer is {n} bytes: retry later"
        )
        body = ErrorBody(error="overloaded", message=message).model_dump_json().encode()
        gone = cycle.scope.get(CLIENT_GONE)
        if gone is not None:
            gone.answered = 503
        _answer_refusals(self.logger, self.loop.time(), message)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.guard.retry_after_s).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _cut(self, cycle: Any, timeout: float) -> None:
        """The client took in nothing for `timeout` s: its connection is closed, the rest of
        its answer dropped (a client abort in the metrics)."""
        scope = cycle.scope
        self.logger.warning(
            "response to %s %s cut: the client took in none of it for %g s",
            scope.get("method"),
            scope.get("path"),
            timeout,
        )
        cycle.disconnected = True
        gone = scope.get(CLIENT_GONE)
        if gone is not None:
            gone.gone = True
        if not self.transport.is_closing():
            self.transport.abort()  # the buffered bytes go too

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()


def uvicorn_options(config: ServerConfig) -> dict[str, Any]:
    """What `cisrank serve` passes uvicorn for these limits: the guarded protocol with the
    config's limits (`with_limits`, which every worker process unpickles), the accept backlog,
    and h11's head limit for the fallback where httptools is missing."""
    http: Any
    try:
        import httptools  # noqa: F401

        http = GuardedHttpToolsProtocol.with_limits(ConnectionLimits.from_config(config))
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        http = "h11"
    return {
        "http": http,
        "backlog": accept_backlog(),
        "h11_max_incomplete_event_size": config.limits.max_header_bytes,
    }
