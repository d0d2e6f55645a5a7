"""ASGI middleware for the edges of a request's life: a server that stops before answering it, and a
client that stops sending its body.

Why raw ASGI, apart from `cisrank.api.middleware`: both act where FastAPI's error handlers cannot.
When `graceful_timeout_s` runs out after SIGTERM, uvicorn cancels the request's task; the
`CancelledError` passes every exception handler (it is not an `Exception`) and uvicorn would answer
a bare text/plain 500. And a body that stalls is awaited in `receive()`, below any route.

- `ShutdownAnswerMiddleware`: a request cancelled before its response started gets the JSON error
  body with 503, Retry-After and `Connection: close`: the client can retry elsewhere, now.
- `BodyReadTimeoutMiddleware`: a body that has not fully arrived `timeout_s` after the request's
  headers gets 408 with the JSON error body, and the connection is closed. The deadline is for the
  whole body, not per chunk, so a client trickling a byte at a time cannot hold a connection.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cisrank.api.errors import ApiError
from cisrank.api.middleware import HttpMiddleware, ResponseTracker
from cisrank.api.schemas import ErrorBody

log = logging.getLogger(__name__)


async def send_json_error(send: Send, error: ApiError) -> None:
    """`error` answered whole through raw ASGI, in the shape `cisrank.api.errors` answers it."""
    body = ErrorBody(error=error.code, message=error.message, fields=error.fields)
    data = body.model_dump_json().encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
    ]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": raw})
    await send({"type": "http.response.body", "body": data, "more_body": False})


class ShutdownAnswerMiddleware(HttpMiddleware):
    """503 + Retry-After (JSON) for a request the server stops before answering.

    uvicorn cancels the tasks still running when `graceful_timeout_s` has passed after SIGTERM;
    nothing else in the server cancels a request's task. The cancellation is absorbed here once
    the answer is sent (`uncancel`), so uvicorn sees a completed response, not an error.
    """

    def __init__(self, app: ASGIApp, retry_after_s: int) -> None:
        super().__init__(app)
        self.retry_after_s = retry_after_s

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracker = ResponseTracker(send)
        try:
            await self.app(scope, receive, tracker)
        except asyncio.CancelledError:
            if tracker.started:  # half a response: only closing the connection is left
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            log.warning(
                "%s %s cancelled by the server stopping: answered 503",
                scope.get("method"),
                scope.get("path"),
            )
            stopped = ApiError(
                503,
                "shutting_down",
                "the server is shutting down and stopped this request before answering it: "
                "retry it (on another instance, or once the server is back)",
                headers={"retry-after": str(self.retry_after_s), "connection": "close"},
            )
            await send_json_error(send, stopped)


class BodyReadTimeout(Exception):
    """The request body did not arrive in time (raised by the timed `receive`)."""


class BodyReadTimeoutMiddleware(HttpMiddleware):
    """408 (JSON) and a closed connection for a body not fully received within `timeout_s`."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        super().__init__(app)
        self.timeout_s = timeout_s

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_done = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:  # later calls wait for a disconnect: no deadline on those
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                raise BodyReadTimeout from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        tracker = ResponseTracker(send)
        try:
            await self.app(scope, timed_receive, tracker)
        except BodyReadTimeout:
            if tracker.started:  # pragma: no cover - our routes read the body before answering
                raise
            message = f"the request body did not arrive within {self.timeout_s:g} s"
            late = ApiError(
                408,
                "request_timeout",
                message,
                field="body",
                field_type="timeout",
                headers={"connection": "close"},
            )
            await send_json_error(send, late)
