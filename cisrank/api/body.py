"""Reading a request body as JSON, strictly, with an answer that says what is wrong with it.

Why not leave it to the web framework: its answer to a body it cannot parse was one sentence for
every cause ("There was an error parsing the body"), a JSON nesting 100,000 deep raised
RecursionError inside it, whether a body without Content-Type was JSON changed between FastAPI
versions, and text holding a lone UTF-16 surrogate (JSON allows the escape `"\\ud800"`, Unicode
does not allow the character) passed through to fail later: the tokenizer raised on it (failing
the whole coalesced batch) and echoing it back could not be encoded (a 500 that dropped the
keep-alive connection). One function here decides all of it, once, for every field of every
route, before any schema or model sees the body:

- Content-Type: JSON (`application/json` or `application/*+json`, charset UTF-8 if given); a body
  without one is read as JSON too (the only body type served, and what hand-written clients and
  `curl --data-binary` without `-H` send); any other type is 415 naming the header.
- Bytes: UTF-8 (a leading byte order mark is skipped, RFC 8259 section 8.1); anything else is 400
  naming the offset of the first bad byte. UTF-16/32 bodies are refused like any non-UTF-8.
- Syntax: 400 with the parser's reason, line, column and character, and "ends early" when the
  body stops in the middle of a value (a truncated upload).
- Numbers: an integer of more digits than Python converts (4,300) is 400 naming its offset (the
  parser raises a bare ValueError on it, which was a 500).
- Depth: at most `MAX_DEPTH` levels of arrays/objects (requests need 4; document metadata gets
  the rest); deeper is 400, and so is anything too deep for the parser's recursion.
- Text: every string and every object key is valid Unicode; a lone surrogate is 422 naming the
  field by its dotted path (`documents.3.text`), the way schema errors name it.

No web framework here (an import-linter contract): the routes turn `BodyError` into a response.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import numpy as np

MAX_DEPTH = 64
"""Levels of nested arrays/objects a body may have; the request shapes need at most 4."""

_JSON_SUBTYPE = re.compile(r"^application/(?:json|[^;\s]+\+json)$")


class BodyError(Exception):
    """A body that cannot be read: `status`, a short `code`, the `field` to name and why."""

    def __init__(self, status: int, code: str, field: str, detail: str, kind: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.status = status
        self.code = code
        self.field = field
        self.detail = detail
        self.kind = kind

    @property
    def message(self) -> str:
        return str(self)


def check_content_type(value: str | None) -> None:
    """Accept JSON content types (and none); raise 415 for anything else."""
    if value is None or not value.strip():
        return
    media, _, params = value.partition(";")
    media = media.strip().lower()
    if not _JSON_SUBTYPE.match(media):
        raise BodyError(
            415,
            "unsupported_media_type",
            "content-type",
            f"the body is sent as '{media[:100]}': send JSON with 'Content-Type: application/json'",
            "content_type",
        )
    for param in params.split(";"):
        key, _, charset = param.partition("=")
        charset = charset.strip().strip('"').lower()
        if key.strip().lower() == "charset" and charset not in {"utf-8", "utf8"}:
            raise BodyError(
                415,
                "unsupported_media_type",
                "content-type",
                f"charset '{charset[:40]}' is not served: send JSON encoded as UTF-8 with "
                "'Content-Type: application/json'",
                "content_type",
            )


def decode_utf8(raw: bytes) -> str:
    """The body as text; 400 naming the first byte that is not UTF-8."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1].hex()
        raise BodyError(
            400,
            "invalid_request",
            "body",
            f"the body is not valid UTF-8: byte 0x{bad} at offset {exc.start} "
            f"({exc.reason}); send JSON encoded as UTF-8",
            "utf8_invalid",
        ) from None


def _too_deep() -> BodyError:
    return BodyError(
        400,
        "invalid_request",
        "body",
        f"JSON nested too deep: at most {MAX_DEPTH} levels of arrays and objects",
        "json_too_deep",
    )


# A JSON string (skipped whole, so that digits inside one never match) or an integer of more
# digits than Python converts (`sys.get_int_max_str_digits()`, 4,300 by default).
_STRING_OR_LONG_INT = r'"[^"\\]*(?:\\.[^"\\]*)*"|(-?[0-9]{%d,})'


def _long_integer(text: str) -> BodyError:
    """400 naming the first JSON integer (outside strings) with more digits than Python reads:
    `json.loads` raises a bare ValueError for it, with no position."""
    limit = sys.get_int_max_str_digits()
    where = ""
    for match in re.finditer(_STRING_OR_LONG_INT % (limit + 1), text):
        if match.group(1) is not None:
            at = match.start(1)
            line = text.count("\n", 0, at) + 1
            column = at - (text.rfind("\n", 0, at) + 1) + 1
            digits = len(match.group(1).lstrip("-"))
            where = f" ({digits} digits at line {line} column {column} (char {at}))"
            break
    return BodyError(
        400,
        "invalid_request",
        "body",
        f"a JSON integer is too long{where}: at most {limit} digits are read; send a number "
        "that fits the field, or a long identifier as a string",
        "json_invalid",
    )


def parse_json(text: str) -> Any:
    """The JSON value; 400 saying where it is malformed, that it is nested too deep, or that an
    integer has too many digits."""
    try:
        return json.loads(text)
    except RecursionError:
        raise _too_deep() from None
    except json.JSONDecodeError as exc:
        detail = f"malformed JSON: {exc.msg}: line {exc.lineno} column {exc.colno} (char {exc.pos})"
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            detail += f"; the body ends early, at char {len(text)} (truncated?)"
        raise BodyError(400, "invalid_request", "body", detail, "json_invalid") from None
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise _long_integer(text) from None


_NOT_STRUCTURAL = bytes(c for c in range(256) if c not in b'"[]{}')
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def check_depth(raw: bytes) -> None:
    """400 when well-formed JSON `raw` nests arrays/objects deeper than `MAX_DEPTH` levels.

    Measured on the bytes at C speed rather than by walking the parsed value in Python (a 15 MB
    body can hold 5 million empty arrays): escaped backslashes and quotes dropped, then only
    quotes and brackets kept; a bracket counts when an even number of quotes precede it (it is
    not inside a string), and the depth is the running sum of +1 per opening, -1 per closing.
    UTF-8 continuation bytes are never ASCII, so byte-wise is exact for a UTF-8 body."""
    kept = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURAL)
    if kept.count(b"[") + kept.count(b"{") <= MAX_DEPTH:
        return
    codes = np.frombuffer(kept, dtype=np.uint8)
    inside = np.bitwise_xor.accumulate(codes == ord('"'))
    steps = np.where(inside, np.int8(0), _STEP[codes])
    # Depth is below the parser's recursion limit (about 1,000) here: int16 cannot overflow.
    if int(np.cumsum(steps, dtype=np.int16).max()) > MAX_DEPTH:
        raise _too_deep()


def _key(part: str | int) -> str:
    return str(part).encode("utf-8", "backslashreplace").decode("utf-8")


def _surrogate_at(text: str) -> int | None:
    """The index of the first lone surrogate in `text`, or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _encodes(value: Any) -> bool:
    """Whether every string and key in `value` is valid Unicode (json's C encoder, then UTF-8)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(path: tuple[str | int, ...], detail: str) -> BodyError:
    return BodyError(
        422,
        "invalid_request",
        ".".join(_key(p) for p in path) or "body",
        f"{detail}: text must be valid Unicode (send U+FFFD for an unknown character)",
        "lone_surrogate",
    )


def check_text(value: Any) -> None:
    """422 naming the first string or key (in document order) that holds a lone surrogate.

    One pass of json's C encoder says whether there is one; only then is it located, by halving
    each container's members with the same encoder (C speed again, whatever the body's shape)."""
    if _encodes(value):
        return
    node = value
    path: tuple[str | int, ...] = ()
    while not isinstance(node, str):
        keys = list(node) if isinstance(node, dict) else None
        values = list(node.values()) if isinstance(node, dict) else node
        lo, hi = 0, len(values)  # the first bad member is in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            half = (
                values[lo:mid]
                if keys is None
                else dict(zip(keys[lo:mid], values[lo:mid], strict=True))
            )
            if _encodes(half):
                lo = mid
            else:
                hi = mid
        node = values[lo]
        if keys is None:
            path = (*path, lo)
            continue
        if _surrogate_at(keys[lo]) is not None:
            raise _lone_surrogate(
                path, f"the key '{_key(keys[lo])[:100]}' holds a lone UTF-16 surrogate"
            )
        path = (*path, keys[lo])
    at = _surrogate_at(node) or 0
    code = f"\\u{ord(node[at]):04x}"
    raise _lone_surrogate(path, f"holds a lone UTF-16 surrogate ({code} at character {at})")


def read_json_body(raw: bytes, content_type: str | None) -> Any:
    """The parsed body of a JSON request, or a `BodyError` that says what is wrong with it."""
    check_content_type(content_type)
    text = decode_utf8(raw)
    value = parse_json(text)
    check_depth(raw)
    # Only an escape can put a lone surrogate in a str decoded from UTF-8: skip the check when
    # the body holds no escape of one (a pair, as ASCII-only JSON writes an emoji, does).
    if b"\\ud" in raw or b"\\uD" in raw:
        check_text(value)
    return value
