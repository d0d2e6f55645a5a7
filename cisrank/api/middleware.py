"""ASGI middleware: the request body limit, the in-flight body bytes budget, per-route metrics.

All are raw ASGI rather than FastAPI middleware: the body limit and the budget must act before
the body is read or parsed (a chunked upload has no Content-Length to check), and the metrics
must see the final status of every response, errors answered by handlers included.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cisrank.api.auth import UNAUTHORIZED, KeyChecker, is_open
from cisrank.api.schemas import ErrorBody, FieldError
from cisrank.serving.metrics import CLIENT_CLOSED_REQUEST, Metrics


class HttpMiddleware:
    """Raw ASGI middleware that acts on HTTP requests only (`http`); anything else (the lifespan
    protocol) passes through to the app untouched. Every middleware of the app is one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class ResponseTracker:
    """A `send` that remembers whether the response has started (after that, no other answer)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


async def answer_then_drop_body(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    max_body_bytes: int,
    received: int = 0,
    ended: bool = False,
) -> None:
    """Answer `status` with the JSON `body` (and `Connection: close`) before the request's body
    is read, then read and drop what is left of that body, then end the response, which closes
    the connection.

    Why drop the body instead of closing at once: closing a connection with unread bytes makes
    the kernel reset it, which discards the answer the client has not read yet (47 of 64
    refused 15 MB uploads saw no answer, bench/RESULTS.md "Memory under 64 concurrent 15 MB
    bodies"). The rest is read chunk by chunk and never held, at most `max_body_bytes` of it, until
    it ends, the client hangs up or the body deadline passes (the timed `receive` raises). A client
    that sent `Expect: 100-continue` has sent no body: answered and closed at once, as is one whose
    body has `ended` already."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": True})
    expect = dict(scope.get("headers") or []).get(b"expect", b"").lower()
    if not ended and b"100-continue" not in expect:
        try:
            while received <= max_body_bytes:
                message = await receive()
                if message["type"] != "http.request":
                    break
                received += len(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        except Exception:  # BodyReadTimeout: the deadline of every body applies
            pass
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class BodyLimitMiddleware(HttpMiddleware):
    """413 for bodies over the byte limit, declared (Content-Length) or streamed (chunked)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def _reject(self, send: Send, status: int, message: str) -> None:
        body = ErrorBody(
            error="payload_too_large" if status == 413 else "invalid_request",
            message=message,
            fields=[FieldError(field="body", message=message, type="size")],
        ).model_dump_json()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await self._reject(send, 400, "Content-Length is not an integer")
                return
            if size > self.max_bytes:
                await self._reject(
                    send, 413, f"request body of {size} bytes is over the limit of {self.max_bytes}"
                )
                return
        # Read the body here, bounded, and replay it: a chunked upload cannot exceed the limit.
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await self._reject(
                    send, 413, f"request body is over the limit of {self.max_bytes} bytes"
                )
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        chunks.clear()  # the joined copy is what is replayed: the pieces would double it
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# ------------------------------------------------------------ in-flight body bytes (finding 5a)


class _Streamed:
    """A body without a Content-Length while it is being received: what it holds of the budget,
    its place in line (`seq`: older is smaller), and the flag set when an older one takes its
    bytes (`evicted`)."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.held = 0
        self.receiving = True  # until its body is complete: only then may it be evicted
        self.evicted = asyncio.Event()


class ByteBudget:
    """Bytes held at once against a limit; used from the event loop's thread only, so plain
    integers suffice. Request bodies (`BodyBytesBudget`) and responses in flight
    (`cisrank.api.http_protocol.ResponseBudget`) each keep one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        """Reserve `n` bytes; False (nothing reserved) when that would go over the limit."""
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class BodyBytesBudget(ByteBudget):
    """Bytes of request bodies this process holds at once. One per app, used only from the
    event loop's thread, so plain integers suffice.

    A body with a Content-Length reserves it whole before a byte is read (`take`). A streamed
    (chunked) body grows its reservation chunk by chunk (`grow`), and when its next chunk does
    not fit, it takes the bytes of streamed bodies that arrived after it, youngest first
    (`_Streamed.evicted`: they are refused and drop what they hold), instead of being refused
    itself while younger ones keep theirs. Without that, concurrent chunked uploads that
    together pass the budget starved each other: each held part of it and each was refused at
    its next chunk, so 24 concurrent 15 MB uploads got 0 answers where 16 of 24 with a
    Content-Length were served (docs/reliability.md). Now the oldest are served, as many as fit, as
    with Content-Length, and every other one is told 503."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._streams: dict[int, _Streamed] = {}
        self._seq = 0

    def stream(self) -> _Streamed:
        """A streamed body starts: it holds nothing yet, and is the youngest."""
        self._seq += 1
        stream = _Streamed(self._seq)
        self._streams[stream.seq] = stream
        return stream

    def grow(self, stream: _Streamed, n: int) -> bool:
        """Reserve `n` more bytes for `stream`, evicting younger streams (youngest first) where
        that makes room; False (nothing reserved, nobody evicted) when even all of them would
        not."""
        short = self.used + n - self.limit
        if short > 0:
            younger = sorted((s for s in self._streams.values() if s.seq > stream.seq), key=_seq)
            freed, evicted = 0, []
            for other in reversed(younger):
                if freed >= short:
                    break
                if other.held and not other.evicted.is_set():
                    freed += other.held
                    evicted.append(other)
            if freed < short:
                return False
            for other in evicted:  # their bytes are this stream's from now on
                self.used -= other.held
                other.held = 0
                other.evicted.set()
                self.end(other)
        self.used += n
        stream.held += n
        return True

    def end(self, stream: _Streamed) -> None:
        """The stream's body is complete (or refused): it can no longer be evicted. Its bytes
        stay reserved until the request gives them back."""
        stream.receiving = False
        self._streams.pop(stream.seq, None)


def _seq(stream: _Streamed) -> int:
    return stream.seq


class _OverBudget(Exception):
    """Raised out of `receive` when a body's next chunk does not fit the budget (or an older
    body took its bytes); `body_ended` when no more of it is to come."""

    def __init__(self, body_ended: bool = False) -> None:
        super().__init__()
        self.body_ended = body_ended


class BodyBudgetMiddleware(HttpMiddleware):
    """503 + Retry-After when the request bodies in flight would exceed `max_inflight_bytes`.

    Why: every admitted body is held, then parsed into Python objects a few times its size, until
    its response is sent; 64 concurrent 15 MB bodies took a server from 0.7 to 4.2 GB
    (bench/RESULTS.md, "Memory under 64 concurrent 15 MB bodies"). Bytes are reserved before they are read: the whole Content-Length up front (a body
    that does not fit is refused without reading a byte of it), or chunk by chunk for a chunked
    body, older chunked bodies before younger ones (`BodyBytesBudget`: chunked and sized bodies
    are served alike); they are given back when the response is done. Sits outside
    `BodyLimitMiddleware`,
    whose reads it counts; a declared body over `max_body_bytes` (or a malformed Content-Length)
    is left to that middleware's 413 (400) without reserving.

    A refused client is told to retry, and every refused client reads that answer: the 503 is
    sent at once, then the rest of its body is read and dropped chunk by chunk (never held:
    memory stays bounded), at most `max_body_bytes` of it and only until the body deadline of
    `BodyReadTimeoutMiddleware`, and only then is the response ended and the connection closed.
    Closing with the body unread made the kernel reset the connection, which discards the 503
    the client had not read yet: 47 of 64 concurrent 15 MB uploads saw no answer
    (bench/RESULTS.md). A client that sent `Expect: 100-continue` has sent no body: its connection
    closes at once.
    """

    def __init__(
        self, app: ASGIApp, max_inflight_bytes: int, max_body_bytes: int, retry_after_s: int
    ) -> None:
        super().__init__(app)
        self.budget = BodyBytesBudget(max_inflight_bytes)
        self.max_body_bytes = max_body_bytes
        self.retry_after_s = retry_after_s

    async def _reject(
        self, scope: Scope, receive: Receive, send: Send, received: int, ended: bool = False
    ) -> None:
        """The 503, then the unread rest of the body dropped (see the class doc), then the end
        of the response, which closes the connection."""
        message = (
            f"the server holds {self.budget.used} bytes of request bodies, its limit is "
            f"{self.budget.limit}: retry later"
        )
        body = ErrorBody(error="overloaded", message=message).model_dump_json().encode()
        headers = [(b"retry-after", str(self.retry_after_s).encode())]
        await answer_then_drop_body(
            scope, receive, send, 503, body, headers, self.max_body_bytes, received, ended
        )

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is None:
            await self._streamed(scope, receive, send)
            return
        try:
            size = int(declared)
        except ValueError:
            size = -1
        if not 0 <= size <= self.max_body_bytes:
            await self.app(scope, receive, send)  # the body limit answers 400/413
            return
        if not self.budget.take(size):
            await self._reject(scope, receive, send, 0)
            return
        held = size
        received = 0
        tracker = ResponseTracker(send)

        async def counted_receive() -> Message:
            nonlocal held, received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > held:  # more than declared: the server will refuse it anyway
                    if not self.budget.take(received - held):
                        raise _OverBudget
                    held = received
            return message

        try:
            await self.app(scope, counted_receive, tracker)
        except _OverBudget:
            if not tracker.started:
                await self._reject(scope, receive, send, received)
        finally:
            self.budget.give(held)

    async def _streamed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A body without a Content-Length (chunked): reserved as it arrives, in line with the
        other streamed bodies (see `BodyBytesBudget`). While it is read, each wait for its next
        chunk also waits for an older body taking its bytes, which refuses it at once."""
        stream = self.budget.stream()
        received = 0
        tracker = ResponseTracker(send)

        async def next_message() -> Message:
            if stream.evicted.is_set():
                raise _OverBudget
            chunk = asyncio.ensure_future(receive())
            evicted = asyncio.ensure_future(stream.evicted.wait())
            try:
                await asyncio.wait({chunk, evicted}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                evicted.cancel()
                if not chunk.done():
                    chunk.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await chunk
            if stream.evicted.is_set():  # a chunk that came with it is dropped as well
                ended = chunk.done() and not chunk.cancelled() and chunk.exception() is None
                message = chunk.result() if ended else {}
                raise _OverBudget(body_ended=ended and not message.get("more_body", False))
            return chunk.result()

        async def counted_receive() -> Message:
            nonlocal received
            if not stream.receiving and not stream.evicted.is_set():
                return await receive()  # the body is complete: later calls wait for hang-ups
            message = await next_message()
            if message["type"] == "http.request":
                n = len(message.get("body", b""))
                received += n
                if n and not self.budget.grow(stream, n):
                    raise _OverBudget
                if not message.get("more_body", False):
                    self.budget.end(stream)
            else:
                self.budget.end(stream)
            return message

        try:
            await self.app(scope, counted_receive, tracker)
        except _OverBudget as exc:
            if not tracker.started:
                await self._reject(scope, receive, send, received, exc.body_ended)
        finally:
            self.budget.end(stream)
            self.budget.give(stream.held)
            stream.held = 0


# ------------------------------------------------------------------------------------ API keys


class KeyGateMiddleware(HttpMiddleware):
    """401 from the request head alone for a request without a valid key to any path that is
    not open (an unknown path included: without a key, nothing about the routes is told).

    Sits outside the body limit and the body budget, so the budget is never spent on a client
    that has not shown a key. The 401 is sent at once; the body the client may be sending is
    then read and dropped, never held, as the budget's 503 does (closing with it unread resets
    the connection, and the client never reads its 401)."""

    def __init__(self, app: ASGIApp, keys: KeyChecker, max_body_bytes: int) -> None:
        super().__init__(app)
        self.keys = keys
        self.max_body_bytes = max_body_bytes
        self._body = (
            ErrorBody(
                error="unauthorized",
                message=UNAUTHORIZED,
                fields=[
                    FieldError(field="authorization", message=UNAUTHORIZED, type="unauthorized")
                ],
            )
            .model_dump_json()
            .encode()
        )

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.keys.enabled:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        authorization = None
        for name, value in scope.get("headers") or []:
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        if is_open(path) or self.keys.allows(authorization):
            await self.app(scope, receive, send)
            return
        headers = [(b"www-authenticate", b"Bearer")]
        await answer_then_drop_body(
            scope, receive, send, 401, self._body, headers, self.max_body_bytes
        )


# ----------------------------------------------------------------------------- trailing slash


class TrailingSlashMiddleware(HttpMiddleware):
    """`/v1/rerank/` is served as `/v1/rerank` (the path rewritten, nothing redirected) for
    every path of `paths`; any other path is left to the routes (404).

    Why: Starlette answered a trailing slash with a 307 to a URL built from the request's
    `Host` header, so `POST /v1/rerank/` with `Host: evil.example` was redirected to
    `http://evil.example/v1/rerank` (an open redirect, and a client that follows it sends its
    body, and its key, to that host). The app is built with `redirect_slashes=False`."""

    def __init__(self, app: ASGIApp, paths: Collection[str]) -> None:
        super().__init__(app)
        self.paths = frozenset(paths)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if len(path) > 1 and path.endswith("/"):
            root = scope.get("root_path", "")
            bare = path.rstrip("/")
            route = bare[len(root) :] if root and bare.startswith(root) else bare
            if route in self.paths:
                scope = dict(scope, path=bare)
                raw = scope.get("raw_path")
                if isinstance(raw, bytes):
                    scope["raw_path"] = raw.rstrip(b"/")
        await self.app(scope, receive, send)


# ------------------------------------------------------------------------------------ metrics

CLIENT_GONE = "cisrank.client_gone"
"""The scope key of a request's `ClientGone`, which `cisrank serve`'s connection protocol
(`cisrank.api.http_protocol`) puts in every request's scope."""


class ClientGone:
    """Whether the client hung up before this request's response was complete: set by the
    connection protocol when the connection is lost (the app's sends then go nowhere, silently,
    and the status it sent is not what the client got). One per request; copies of the scope
    share it."""

    __slots__ = ("answered", "gone")

    def __init__(self) -> None:
        self.gone = False
        self.answered: int | None = None
        """The status the client was sent instead of the app's (a 503 of the response budget)."""


class MetricsMiddleware(HttpMiddleware):
    """Counts requests and latency per route template (bounded label cardinality); a request whose
    client hung up before any answer counts as a client abort (499), not as a 500."""

    def __init__(self, app: ASGIApp, metrics: Metrics, paths: Collection[str] = ()) -> None:
        super().__init__(app)
        self.metrics = metrics
        # Requests answered before routing (413, 408, client aborts) have no route yet: those to
        # one of these paths (the app's routes, no path parameters) are counted under it.
        self.paths = frozenset(paths)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status: int | None = None
        client_gone = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        async def receive_wrapper() -> Message:
            nonlocal client_gone
            message = await receive()
            client_gone = client_gone or message["type"] == "http.disconnect"
            return message

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", None)
            if route is None:
                route = scope["path"] if scope.get("path") in self.paths else "unmatched"
            seconds = time.perf_counter() - started
            lost = scope.get(CLIENT_GONE)
            if isinstance(lost, ClientGone) and lost.answered is not None:
                status = lost.answered
            # hung up mid-body, or while its generation ran (answered 499 to nobody), or before
            # its response was complete: client behaviour, not a server error nor a 200
            if (client_gone and status in (None, CLIENT_CLOSED_REQUEST)) or (
                isinstance(lost, ClientGone) and lost.gone
            ):
                self.metrics.observe_client_abort(route, seconds)
            else:
                self.metrics.observe_request(route, status or 500, seconds)
