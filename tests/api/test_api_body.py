"""`cisrank.api.body.read_json_body` alone: the rules behind the edge's answers, at their limits."""

from __future__ import annotations

import json

import pytest

from cisrank.api.body import MAX_DEPTH, BodyError, long_integer_at, read_json_body


def _nest(levels: int, leaf: str = "x") -> bytes:
    value: object = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return json.dumps(value).encode()


def _error(raw: bytes, content_type: str | None = None) -> BodyError:
    with pytest.raises(BodyError) as info:
        read_json_body(raw, content_type)
    return info.value


@pytest.mark.parametrize("leaf", ["x", '\\"[[[[' * 40 + "\\\\", "]]}}" * 40, "{[" * 80])
def test_depth_limit_is_exact_and_ignores_brackets_in_strings(leaf):
    assert read_json_body(_nest(MAX_DEPTH, leaf), None) is not None
    error = _error(_nest(MAX_DEPTH + 1, leaf))
    assert (error.status, error.field, error.kind) == (400, "body", "json_too_deep")


def test_surrogate_pairs_are_text_and_lone_halves_are_not():
    assert read_json_body(b'["\\ud83d\\ude00", "\\uD7FF"]', None) == ["\U0001f600", "\ud7ff"]
    for raw, field in [
        (b'["ok", "\\ude00\\ud83d"]', "1"),  # reversed pair: two lone halves
        (b'{"a": {"b": ["x", "y", "\\udbff"]}}', "a.b.2"),
        (b'{"a": [{"\\udc00": 1}]}', "a.0"),
        (b'"\\ud800"', "body"),
    ]:
        error = _error(raw)
        assert (error.status, error.field, error.kind) == (422, field, "lone_surrogate"), raw


def test_an_escaped_backslash_before_u_is_not_a_surrogate():
    assert read_json_body(b'["\\\\ud800"]', None) == ["\\ud800"]


def test_the_first_lone_surrogate_in_document_order_is_named():
    docs = ["fine"] * 1000 + ["a\ud800", "b\udfff"]
    error = _error(json.dumps({"documents": docs}).encode())
    assert error.field == "documents.1000"


def test_locating_a_lone_surrogate_among_many_members_stays_linear(monkeypatch):
    """A 1.2 MB body of 400,000 tiny arrays with a lone surrogate at its end: located from the
    bytes, handing json only the key above it and the string itself (a Python walk over every
    member, or halving them with json's encoder, did more). Its speed against the parser's is
    measured in bench/body_checks.py."""
    raw = b'{"documents": [' + b",".join([b"[]"] * 400_000) + b', "\\ud800"]}'
    assert _error(raw).field == "documents.400000"
    error, handed = _located_with_json_work(raw, monkeypatch)
    assert error is not None and error.field == "documents.400000"
    assert handed == len(b'"documents"') + len(b'"\\ud800"'), handed


def test_an_integer_of_more_than_4300_digits_is_400_naming_its_offset():
    """`json.loads` raises a bare ValueError (no position) for an integer of more digits than Python
    converts; it was a 500 on every JSON route."""
    raw = b'{"query": "q",\n "top_n": 1' + b"0" * 5000 + b"}"
    error = _error(raw)
    assert (error.status, error.field, error.kind) == (400, "body", "json_invalid")
    assert "5001 digits at line 2 column 11 (char 25)" in error.message, error.message
    # digits inside a string are text, and a long float is a number (inf), not an integer
    long_id = b'{"id": "' + b"7" * 9000 + b'", "x": -' + b"9" * 4301 + b"}"
    assert "4301 digits at line 1 column 9017 (char 9016)" in _error(long_id).message
    assert read_json_body(b"[1" + b"0" * 5000 + b".5]", None) == [float("inf")]
    assert read_json_body(b"[" + b"9" * 4300 + b"]", None) == [int("9" * 4300)]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/v1/search",
        "/v1/context",
        "/v1/generate",
        "/v1/embeddings",
    ],
)
def test_a_huge_integer_is_400_on_every_json_route(make_client, path):
    from api_fakes import OverlapReranker

    client = make_client({"ov": OverlapReranker()})
    raw = b'{"query": "q", "documents": ["a"], "top_n": 1' + b"0" * 5000 + b"}"
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["fields"] == [
        {
            "field": "body",
            "message": "a JSON integer is too long (5001 digits at line 1 column 45 (char 44)): "
            "at most 4300 digits are read; send a number that fits the field, or a long "
            "identifier as a string",
            "type": "json_invalid",
        }
    ]


# ---- every check before the work is linear in the body


def _located_with_json_work(raw: bytes, monkeypatch) -> tuple[BodyError | None, int]:
    """What `locate_lone_surrogate` answers for `raw`, and the bytes it handed to json (read or
    written): only the strings on the path need json; any other use of the module fails."""
    from cisrank.api import body

    handed: list[int] = []

    class Counted:
        def loads(self, text, *args, **kwargs):
            handed.append(len(text))
            return json.loads(text, *args, **kwargs)

        def dumps(self, value, *args, **kwargs):
            out = json.dumps(value, *args, **kwargs)
            handed.append(len(out))
            return out

        def __getattr__(self, name):
            raise AssertionError(f"the locator used json.{name}")

    with monkeypatch.context() as patched:
        patched.setattr(body, "json", Counted())
        error = body.locate_lone_surrogate(raw)
    return error, sum(handed)


def test_locating_a_long_integer_among_many_long_runs_is_linear():
    """A body of 100 runs of 4,300 digits then one of 5,000 (0.44 MB) took 1.9 s to locate (the
    regex restarted at every digit of every run: quadratic; 16.6 MB took 74 s), against a few
    milliseconds for `json.loads` to refuse it. Located in one linear pass now, before the parser
    converts a single one of them, within a small multiple of the time the parser takes to read the
    same body (bench/body_checks.py: 0.53 of it on 16.6 MB)."""
    runs = b",".join([b"1" * 4300] * 100)
    raw = b'{"query": "q", "x": [' + runs + b'],\n "top_n": -' + b"7" * 5000 + b"}"
    error = _error(raw)
    at = raw.index(b"-7")  # 430,133: the sign's offset, as the parser counts characters
    assert f"5000 digits at line 2 column 11 (char {at})" in error.message, error.message
    assert long_integer_at(raw, 4300) == (at, 5000)


def test_long_digit_runs_that_python_reads_are_not_integers():
    """Floats (integer part, fraction, exponent) and strings of any length are read, and the
    long integer named is the first one outside them, with its sign."""
    long = b"9" * 4301
    fine = (
        b'{"f": [' + long + b".5, 0." + long + b", 1e-" + long + b', 2E+1], "s": "' + long + b'"}'
    )
    assert read_json_body(fine, None)["s"] == long.decode()
    escaped = b'{"s": "\\\\\\"' + long + b'\\"", "n": [1, -' + long + b"]}"
    error = _error(escaped)
    assert (error.status, error.kind) == (400, "json_invalid")
    at = escaped.index(b"-" + long)
    assert f"4301 digits at line 1 column {at + 1} (char {at})" in error.message, error.message
    # a character offset, not a byte offset, after multi-byte text
    multi = '{"s": "é€😀", "n": '.encode() + long + b"}"
    char = multi.decode().index("9")  # 18 characters, 24 bytes
    assert f"4301 digits at line 1 column {char + 1} (char {char})" in _error(multi).message


def _reference_path(value, path=()):
    """The first string or key holding a lone surrogate, by walking the value in document order
    (the brute-force reference): (path, key or None, the string)."""
    if isinstance(value, str):
        return (path, None, value) if _has_lone(value) else None
    if not isinstance(value, (dict, list)):
        return None
    members = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in members:
        if isinstance(key, str) and _has_lone(key):
            return (path, key, key)
        found = _reference_path(child, (*path, key))
        if found is not None:
            return found
    return None


def _has_lone(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _random_text(rng) -> str:
    pieces = [
        "a",
        "é",
        "😀",
        "\\",
        '"',
        "\\u",
        "[",
        "]{,:",
        " ",
        "\ud800",
        "\udc00",
        "\ud83d\ude00",
    ]
    return "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 6)))


def _random_value(rng, depth: int):
    roll = rng.random()
    if depth >= 6 or roll < 0.35:
        return rng.choice([_random_text(rng), 7, -1.5, None, True, []])
    if roll < 0.7:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    return {
        _random_text(rng) + str(i): _random_value(rng, depth + 1)
        for i in range(rng.randrange(0, 5))
    }


def test_the_lone_surrogate_named_is_the_brute_force_walks_first():
    """The linear locator against a walk of the parsed value: 600 random bodies of nested
    arrays and objects whose strings and keys mix lone halves, pairs, escaped backslashes and
    quotes, brackets, commas and colons, written with and without escapes for non-ASCII."""
    import random

    rng = random.Random(48)
    located = 0
    for case in range(600):
        text = json.dumps(_random_value(rng, 0), ensure_ascii=False, indent=case % 3 or None)
        if case % 2 or _has_lone(text):  # surrogates written raw are not UTF-8: escape them
            text = json.dumps(json.loads(text), indent=case % 3 or None)
        raw = text.encode()
        value = json.loads(raw)  # what the decoder reads (adjacent halves make a pair)
        expected = _reference_path(value)
        if expected is None:
            assert read_json_body(raw, None) == value, raw
            continue
        located += 1
        error = _error(raw)
        path, key, text = expected
        assert error.field == (".".join(str(p) for p in path) or "body"), (raw, error.message)
        if key is not None:
            assert "the key '" in error.detail, (raw, error.detail)
        else:
            first = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
            assert f"at character {first})" in error.detail, (raw, error.detail)
    assert located > 100


def test_a_lone_surrogate_under_63_levels_is_located_in_one_pass(monkeypatch):
    """A large body nested 63 deep with a lone surrogate at the bottom was re-encoded once per level
    while locating it (halving each container's members encoded the first one, which holds all the
    rest, at every level: 15 MB took 3.9 s, the event loop stalled; 0.2 s without the surrogate).
    One pass over the bytes now, handing json only the 31 keys on the path and the string itself
    (bench/body_checks.py measures it: about 5 times the parser's time on the 15 MB body, against
    about 60 before)."""
    leaf = ["x" * 40] * 100_000 + ["\ud800"]
    value: object = leaf
    for i in range(62):
        value = {"k": value, "z": 0} if i % 2 else [value, 0]  # the big member first
    raw = json.dumps(value).encode()
    path = ".".join(["k", "0"] * 31) + ".100000"
    assert _error(raw).field == path
    error, handed = _located_with_json_work(raw, monkeypatch)
    assert error is not None and error.field == path
    assert handed == 31 * len(b'"k"') + len(b'"\\ud800"'), handed


def test_a_large_body_is_read_off_the_event_loop(make_client, monkeypatch):
    """The body was decoded, parsed and checked on the event loop, which stalled `/healthz` for as
    long (74 s on the 16.6 MB body of long integers). A body over `OFF_LOOP_BYTES` is read in a
    worker thread; a small one stays on the loop (a thread hop costs more than reading it)."""
    import asyncio

    from api_fakes import OverlapReranker

    from cisrank.api import routes

    on_loop: list[tuple[int, bool]] = []
    real = routes.read_json_body

    def spy(raw, content_type):
        try:
            asyncio.get_running_loop()
            on_loop.append((len(raw), True))
        except RuntimeError:
            on_loop.append((len(raw), False))
        return real(raw, content_type)

    monkeypatch.setattr(routes, "read_json_body", spy)
    client = make_client({"ov": OverlapReranker()})
    small = {"query": "q", "documents": ["a"]}
    large = {"query": "q", "documents": ["word " * 1000] * 60}  # 300 KB
    assert client.post("/v1/rerank", json=small).status_code == 200
    assert client.post("/v1/rerank", json=large).status_code == 200
    assert [loop for _, loop in on_loop] == [True, False], on_loop
    assert on_loop[1][0] > routes.OFF_LOOP_BYTES
