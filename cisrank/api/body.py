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
  parser raises a bare ValueError on it, which was a 500), found before parsing in one linear
  pass (`long_integer_at`).
- Depth: at most `MAX_DEPTH` levels of arrays/objects (requests need 4; document metadata gets
  the rest); deeper is 400, and so is anything too deep for the parser's recursion.
- Keys: an object that names a key twice is 422 naming it by its dotted path (JSON parsers keep
  the last, or the first, silently: `{"top_n": 1, "top_n": 50}` meant 50 here and may mean 1 to
  a proxy that checked it); found while parsing, at about 1.2x the cost of `json.loads` on a
  body of 200,000 objects.
- Text: every string and every object key is valid Unicode; a lone surrogate is 422 naming the
  field by its dotted path (`documents.3.text`), the way schema errors name it, located in one
  linear pass over the bytes (`locate_lone_surrogate`).

Every check is linear in the body and runs at C speed (docs/reliability.md: two of them were not,
and a 16.6 MB body took 74 s); the route reads a large body in a worker thread, off the event loop.

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


_DIGIT_MARKS = bytes(0x31 if 0x30 <= c <= 0x39 else 0x30 for c in range(256))
"""A translation table: every ASCII digit to b"1", every other byte to b"0"."""


def _neutral(raw: bytes) -> bytes:
    """`raw` with every escaped backslash and escaped quote replaced by two neutral bytes: the
    same offsets, and every quote left is one that opens or closes a string. Pairs are replaced
    left to right, as JSON reads them (in `\\\\\\"` the first two escape each other)."""
    return raw.replace(b"\\\\", b"__").replace(b'\\"', b"__")


def long_integer_at(raw: bytes, limit: int) -> tuple[int, int] | None:
    """(byte offset, digits) of the first JSON integer outside strings with more than `limit`
    digits, or None; the offset is that of its sign, if it has one.

    Linear and at C speed (about 50 ms on 16 MB): every byte marked digit or not with one
    `translate`, runs of more than `limit` digits found with `bytes.find` (each run is found at
    its first digit, since any earlier digit would start an earlier match), and a run counts when
    an even number of string quotes precede it (counted once, incrementally) and it is not the
    integer part, fraction or exponent of a float (which Python reads whatever its length). The
    regex that located it before restarted at every digit of every shorter run: 74 s on a
    16.6 MB body of 4,300-digit runs."""
    if limit <= 0 or len(raw) <= limit:
        return None
    marks = raw.translate(_DIGIT_MARKS)
    run = b"1" * (limit + 1)
    at = marks.find(run)
    if at < 0:
        return None
    quotes_of = _neutral(raw)
    quotes, counted = 0, 0
    while at >= 0:
        end = marks.find(b"0", at)
        end = len(raw) if end < 0 else end
        quotes += quotes_of.count(b'"', counted, at)
        counted = at
        signed = raw[at - 1 : at] == b"-"
        before = raw[at - 2 : at - 1] if signed else raw[at - 1 : at]
        if (
            quotes % 2 == 0
            and before not in (b".", b"e", b"E", b"+", b"-")
            and raw[end : end + 1] not in (b".", b"e", b"E")
        ):
            return (at - 1 if signed else at), end - at
        at = marks.find(run, end)
    return None


def _long_integer(raw: bytes) -> BodyError:
    """400 naming the first JSON integer (outside strings) with more digits than Python reads
    (`json.loads` raises a bare ValueError for it, with no position): its line, column and
    character offset in the text."""
    limit = sys.get_int_max_str_digits()
    found = long_integer_at(raw, limit)
    where = ""
    if found is not None:
        at, digits = found
        line_start = raw.rfind(b"\n", 0, at) + 1
        line = raw.count(b"\n", 0, at) + 1
        column = len(raw[line_start:at].decode("utf-8")) + 1
        char = len(raw[:at].decode("utf-8"))
        where = f" ({digits} digits at line {line} column {column} (char {char}))"
    return BodyError(
        400,
        "invalid_request",
        "body",
        f"a JSON integer is too long{where}: at most {limit} digits are read; send a number "
        "that fits the field, or a long identifier as a string",
        "json_invalid",
    )


class _DuplicateKey(Exception):
    """Raised out of the parser at the first object that names a key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The parser's object hook: the object, or `_DuplicateKey` when a key is in it twice."""
    value = dict(pairs)
    if len(value) != len(pairs):
        raise _DuplicateKey
    return value


class _Pairs(list):
    """An object as the parser read it, every member kept in order (to locate a duplicate)."""


def _duplicate_path(value: Any, path: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    """The path of the first key named twice (at its second naming, in document order) in a
    value parsed with `_Pairs` objects; nesting is bounded (`MAX_DEPTH`, checked before)."""
    if isinstance(value, _Pairs):
        seen: set[str] = set()
        for key, member in value:
            if key in seen:
                return (*path, key)
            seen.add(key)
            found = _duplicate_path(member, (*path, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, member in enumerate(value):
            found = _duplicate_path(member, (*path, i))
            if found is not None:
                return found
    return None


def _duplicate_key(text: str) -> BodyError:
    """422 naming the key an object of `text` (well-formed JSON) names twice."""
    try:
        path = _duplicate_path(json.loads(text, object_pairs_hook=_Pairs)) or ("body",)
    except RecursionError:
        return _too_deep()
    name = ".".join(_key(p) for p in path)
    return BodyError(
        422,
        "invalid_request",
        name,
        f"the key '{_key(path[-1])[:100]}' is given twice in one object: send each key once",
        "duplicate_key",
    )


def parse_json(text: str, raw: bytes | None = None) -> Any:
    """The JSON value of `text` (whose UTF-8 bytes are `raw`, when the caller has them); 400
    saying where it is malformed, that it is nested too deep, or that an integer has too many
    digits; 422 naming a key that an object names twice."""
    limit = sys.get_int_max_str_digits()
    # Checked before parsing, at C speed: the parser converts every integer it meets, and
    # thousands of 4,300-digit ones before the one too long cost it most of a second on 16 MB.
    if limit and len(text) > limit:
        raw = text.encode("utf-8") if raw is None else raw
        if long_integer_at(raw, limit) is not None:
            raise _long_integer(raw)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey:
        raise _duplicate_key(text) from None
    except RecursionError:
        raise _too_deep() from None
    except json.JSONDecodeError as exc:
        detail = f"malformed JSON: {exc.msg}: line {exc.lineno} column {exc.colno} (char {exc.pos})"
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            detail += f"; the body ends early, at char {len(text)} (truncated?)"
        raise BodyError(400, "invalid_request", "body", detail, "json_invalid") from None
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise _long_integer(text.encode("utf-8") if raw is None else raw) from None


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


def _lone_surrogate(path: tuple[str | int, ...], detail: str) -> BodyError:
    return BodyError(
        422,
        "invalid_request",
        ".".join(_key(p) for p in path) or "body",
        f"{detail}: text must be valid Unicode (send U+FFFD for an unknown character)",
        "lone_surrogate",
    )


# An escaped high surrogate not followed by an escaped low one, or an escaped low surrogate not
# preceded by a high one: what JSON decoders leave lone (a pair is one character). Matched on
# `_neutral` bytes, where every backslash left starts an escape; it starts with a literal, which
# the regex engine searches for at C speed (a leading lookbehind made it try every byte).
_LONE_ESCAPE = re.compile(
    rb"\\u[dD](?:[89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|[c-fC-F][0-9a-fA-F]{2}(?<!\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}))"
)
_BLANK = re.compile(rb"[ \t\r\n]*")
_IS_STRUCTURAL = np.zeros(256, dtype=bool)
_IS_STRUCTURAL[list(b"[]{},:")] = True


def _members(neutral: bytes, before: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The JSON structure of `neutral[:before]` (which ends inside the containers of the string
    starting at `before`): (byte offset of each bracket, comma and colon outside strings, its
    byte, the nesting level after it, the level at `before`). Vectorized: linear, C speed."""
    codes = np.frombuffer(neutral, dtype=np.uint8, count=before)
    inside = np.bitwise_xor.accumulate(codes == ord('"'))
    at = np.flatnonzero(~inside & _IS_STRUCTURAL[codes])
    kinds = codes[at]
    levels = np.cumsum(_STEP[kinds], dtype=np.int16)  # within MAX_DEPTH: checked first
    return at, kinds, levels, int(levels[-1]) if len(levels) else 0


def _last_per_level(index: np.ndarray, levels: np.ndarray, size: int) -> np.ndarray:
    """For each level, the largest of `index` at that level (-1 where none)."""
    out = np.full(size, -1, dtype=np.int64)
    np.maximum.at(out, levels.astype(np.int64), index)
    return out


def locate_lone_surrogate(raw: bytes) -> BodyError | None:
    """422 naming the first string or key (in document order) of well-formed JSON `raw` (nested
    at most `MAX_DEPTH` deep) that holds a lone surrogate, or None when none does.

    One pass over the bytes, linear whatever the body's shape: the first lone surrogate escape
    is found by a regex, the string holding it by its quotes, and its path from the structure
    before it, vectorized: each enclosing container is the last bracket opened at its level,
    an array's index the commas at its level since, an object's key the string before the last
    colon at its level since. It located by halving each container's members with json's
    encoder before, which re-encoded the body once per level of nesting: 3.9 s on a 15 MB body
    nested 63 deep (docs/reliability.md). Every escape counts, also one in a member that a later
    duplicate key overrides (RFC 8259 section 8.2: such text is not valid Unicode)."""
    neutral = _neutral(raw)
    found = _LONE_ESCAPE.search(neutral)
    if found is None:
        return None
    start = neutral.rfind(b'"', 0, found.start())
    end = neutral.find(b'"', found.end())
    follows = _BLANK.match(raw, end + 1)
    is_key = follows is not None and raw[follows.end() : follows.end() + 1] == b":"
    at, kinds, levels, depth = _members(neutral, start)
    size = MAX_DEPTH + 2
    opener = np.flatnonzero((kinds == ord("[")) | (kinds == ord("{")))
    opened = _last_per_level(opener, levels[opener], size)
    commas = np.flatnonzero(kinds == ord(","))
    mine = commas > opened[levels[commas]]
    indexes = np.bincount(levels[commas][mine].astype(np.int64), minlength=size)
    colons = np.flatnonzero(kinds == ord(":"))
    mine = colons > opened[levels[colons]]
    last_colon = _last_per_level(colons[mine], levels[colons][mine], size)
    path: list[str | int] = []
    for level in range(1, depth if is_key else depth + 1):
        if kinds[opened[level]] == ord("["):
            path.append(int(indexes[level]))
            continue
        colon = int(at[last_colon[level]])
        key_end = neutral.rfind(b'"', 0, colon)
        key_start = neutral.rfind(b'"', 0, key_end)
        path.append(json.loads(raw[key_start : key_end + 1]))
    text = json.loads(raw[start : end + 1])
    if is_key:
        return _lone_surrogate(
            tuple(path), f"the key '{_key(text)[:100]}' holds a lone UTF-16 surrogate"
        )
    where = _surrogate_at(text) or 0
    code = f"\\u{ord(text[where]):04x}"
    return _lone_surrogate(
        tuple(path), f"holds a lone UTF-16 surrogate ({code} at character {where})"
    )


def read_json_body(raw: bytes, content_type: str | None) -> Any:
    """The parsed body of a JSON request, or a `BodyError` that says what is wrong with it."""
    check_content_type(content_type)
    text = decode_utf8(raw)
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    value = parse_json(text, raw)
    check_depth(raw)
    # Only an escape can put a lone surrogate in a str decoded from UTF-8: skip the check when
    # the body holds no escape of one (a pair, as ASCII-only JSON writes an emoji, does).
    if b"\\ud" in raw or b"\\uD" in raw:
        error = locate_lone_surrogate(raw)
        if error is not None:
            raise error
    return value
