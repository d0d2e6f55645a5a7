"""ASGI middleware: the request body limit and the per-route metrics.

Both are raw ASGI rather than FastAPI middleware: the body limit must act before the body is
parsed (a chunked upload has no Content-Length to check), and the metrics must see the final
status of every response, errors answered by handlers included.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cisrank.api.metrics import Metrics
from cisrank.api.schemas import ErrorBody, FieldError


class BodyLimitMiddleware:
    """413 for bodies over the byte limit, declared (Content-Length) or streamed (chunked)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
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
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class MetricsMiddleware:
    """Counts requests and latency per route template (bounded label cardinality); a request whose
    client hung up before any answer counts as a client abort (499), not as a 500."""

    def __init__(self, app: ASGIApp, metrics: Metrics, paths: Collection[str] = ()) -> None:
        self.app = app
        self.metrics = metrics
        # Requests answered before routing (413, 408, client aborts) have no route yet: those to
        # one of these paths (the app's routes, no path parameters) are counted under it.
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
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
            if status is None and client_gone:  # hung up mid-body: not a server error
                self.metrics.observe_client_abort(route, seconds)
            else:
                self.metrics.observe_request(route, status or 500, seconds)
