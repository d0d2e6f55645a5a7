"""Error answers: `ApiError`, the `ErrorBody` JSON every failure is answered with, and the mapping
of FastAPI's validation errors to the field a user can name (`documents.3.text`, not a pydantic
location with union member names in it).

Every error, whatever raised it, leaves the server in the same shape, so clients need one parser;
`install_error_handlers` puts that shape on an app. Two promises ride on it:

- A bug is a 500 with a generic body and its traceback in the log, and the connection stays open:
  `CatchAllMiddleware` answers it instead of letting it reach uvicorn, which drops a keep-alive
  connection when an application raises (a pooled client's next request then got no answer).
- No answer carries a server path or an exception's text: a server fault (a damaged index file, a
  model that failed to load) is a 5xx that names the component, and the details go to the log.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from cisrank.api.middleware import HttpMiddleware, ResponseTracker
from cisrank.api.schemas import ErrorBody, FieldError
from cisrank.errors import CisrankError, DataError

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered with `status` and an `ErrorBody`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        field_message: str | None = None,
        field_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = (
            [FieldError(field=field, message=field_message or message, type=field_type or code)]
            if field
            else []
        )
        self.headers = headers or {}


def error_response(
    status: int,
    code: str,
    message: str,
    fields: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(error=code, message=message, fields=fields or [])
    return JSONResponse(_printable(body.model_dump()), status_code=status, headers=headers)


def _printable(value: Any) -> Any:
    """`value` with every lone surrogate written as its escape: an error message that quotes the
    request must still encode as UTF-8 (or the answer to a 4xx would be a 500)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


INTERNAL_ERROR = "internal error; see the server log"


class CatchAllMiddleware(HttpMiddleware):
    """Answers an exception no handler took with the generic 500 body, logged with its traceback,
    and returns normally, so uvicorn keeps the keep-alive connection (Starlette's own catch-all
    re-raises after answering, and uvicorn then closes the connection). A response that had
    already started cannot be mended: that exception goes on, and the connection is closed."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracker = ResponseTracker(send)
        try:
            await self.app(scope, receive, tracker)
        except ClientDisconnect:
            raise
        except Exception:
            if tracker.started:
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            response = error_response(500, "internal_error", INTERNAL_ERROR)
            await response(scope, receive, send)


def field_name(loc: Sequence[Any]) -> str:
    """`('body', 'documents', 3, 'DocumentIn', 'text')` -> `documents.3.text`."""
    parts = [str(p) for p in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    # Union members show up as their type names; they are not fields the user can name.
    parts = [
        p
        for p in parts
        if p
        not in {
            "str",
            "DocumentIn",
            "ContextDocumentIn",
            "int",
            "function-after[_non_blank(), str]",
        }
    ]
    return ".".join(parts) or "body"


FIELD_ALIASES = {"top_k": "top_n"}
"""Request fields accepted under a second name (`cisrank.api.schemas.TOP_N_ALIASES`)."""


def validation_fields(errors: Sequence[dict[str, Any]]) -> tuple[int, list[FieldError]]:
    """The status (400 for malformed JSON, else 422) and one `FieldError` per named field."""
    merged: dict[str, FieldError] = {}
    status = 422
    for err in errors:
        kind = str(err.get("type", "invalid"))
        if kind == "json_invalid":
            status = 400
            detail = (err.get("ctx") or {}).get("error", "")
            merged["body"] = FieldError(
                field="body", message=f"malformed JSON: {detail}".rstrip(": "), type=kind
            )
            continue
        name = field_name(err.get("loc", ()))
        msg = str(err.get("msg", "invalid value"))
        if kind == "extra_forbidden":
            alias_of = FIELD_ALIASES.get(name)
            msg = (
                f"{name} is an alias of {alias_of}: give one of them"
                if alias_of
                else "unknown field: this request does not take it (the fields of every "
                "request are in GET /docs)"
            )
        if name in merged and msg not in merged[name].message:
            merged[name] = FieldError(
                field=name, message=f"{merged[name].message}; or {msg}", type=merged[name].type
            )
        else:
            merged.setdefault(name, FieldError(field=name, message=msg, type=kind))
    return status, list(merged.values())


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error as an `ErrorBody`; bugs are 500 and logged, never raised. Call it after
    adding the other middleware: its `CatchAllMiddleware` must be the outermost of them."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.fields, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, fields = validation_fields(exc.errors())
        message = "; ".join(f"{f.field}: {f.message}" for f in fields)
        return error_response(status, "invalid_request", message, fields)

    @app.exception_handler(CisrankError)
    async def _cisrank_error(request: Request, exc: CisrankError) -> JSONResponse:
        if isinstance(exc, DataError):  # a damaged or missing file: the server's fault
            log.error("data error on %s %s: %s", request.method, request.url.path, exc)
            return error_response(500, "internal_error", INTERNAL_ERROR)
        serving = getattr(request.app.state, "serving", None)
        message = serving.redact(str(exc)) if serving is not None else str(exc)
        return error_response(400, "invalid_request", message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        fields = [FieldError(field="body", message=str(exc.detail), type=code)]
        return error_response(
            exc.status_code,
            code,
            str(exc.detail),
            fields if exc.status_code == 400 else [],
            getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", INTERNAL_ERROR)

    app.add_middleware(CatchAllMiddleware)
