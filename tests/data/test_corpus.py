"""Corpus readers: formats, the strict bad-line policy (errors name the line) and skip-and-count."""

import gzip
import json

import pytest

from cisrank.data.corpus import detect_format, file_checksum, read_corpus
from cisrank.errors import DataError


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_tsv_and_gzip_read_in_file_order(tmp_path):
    p = _jsonl(
        tmp_path / "c.jsonl",
        [{"id": "a", "text": "alpha"}, {"id": 7, "text": "seven", "title": "T"}, ""],
    )
    c = read_corpus(p)
    assert c.docids == ["a", "7"]
    assert c.texts == ["alpha", "T\nseven"]
    assert c.stats.passages == 2
    t = tmp_path / "c.tsv.gz"
    t.write_bytes(gzip.compress(b"x\tfirst text\ny\tsecond\ttabbed\n"))
    c = read_corpus(t)
    assert (c.docids, c.texts) == (["x", "y"], ["first text", "second\ttabbed"])
    assert c.stats.sha256 == file_checksum(t)[0]
    assert c.stats.size_bytes == t.stat().st_size


def test_candidates_pool_merges_repeats_and_rejects_conflicts(tmp_path):
    data = [
        {
            "query": "q",
            "hits": [{"docid": "d1", "content": "one"}, {"docid": "d2", "content": "two"}],
        },
        {
            "query": "r",
            "hits": [{"docid": "d2", "content": "two"}, {"docid": "d3", "content": "3"}],
        },
    ]
    p = tmp_path / "cands.json"
    p.write_text(json.dumps(data))
    c = read_corpus(p)
    assert c.docids == ["d1", "d2", "d3"] and c.stats.merged == 1
    data[1]["hits"][0]["content"] = "different"
    p.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"entry 1 hit 0: duplicate passage id 'd2'"):
        read_corpus(p)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "b", "text": ', r"c\.jsonl:2: invalid JSON"),
        ('{"id": "b", "text": "   "}', r"c\.jsonl:2: passage 'b' has empty text"),
        ('{"id": "a", "text": "again"}', r"c\.jsonl:2: duplicate passage id 'a' \(first at 1\)"),
        ('{"id": "b"}', r"c\.jsonl:2: expected fields"),
        ('["b", "text"]', r"c\.jsonl:2: expected a JSON object"),
    ],
)
def test_bad_line_raises_naming_the_line(tmp_path, line, message):
    p = _jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "fine"}, line, {"id": "c", "text": "ok"}])
    with pytest.raises(DataError, match=message):
        read_corpus(p)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # json's message ends in "at" here ("Invalid control character at": the line's end)
        ('{"id": "b", "text": "unterminated', "Invalid control character at column 34"),
        ('{"id": "b" "text": "x"}', "Expecting ',' delimiter at column 12"),
    ],
)
def test_broken_json_says_what_and_at_which_column_once(tmp_path, line, message):
    p = _jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "fine"}, line])
    with pytest.raises(DataError, match=r"c\.jsonl:2: invalid JSON \(") as err:
        read_corpus(p)
    assert message in str(err.value) and "at at" not in str(err.value)


def test_skip_mode_counts_every_bad_line(tmp_path):
    p = _jsonl(
        tmp_path / "c.jsonl",
        [
            {"id": "a", "text": "fine"},
            "{broken",
            {"id": "b", "text": ""},
            {"id": "a", "text": "dup"},
            {"id": "c", "text": "ok"},
        ],
    )
    c = read_corpus(p, on_error="skip")
    assert c.docids == ["a", "c"]
    assert c.texts == ["fine", "ok"]
    assert dict(c.stats.skipped) == {"invalid_json": 1, "empty_text": 1, "duplicate_id": 1}


def test_tsv_line_without_tab_and_unknown_suffix(tmp_path):
    p = tmp_path / "c.tsv"
    p.write_text("a\tfine\nno tab here\n")
    with pytest.raises(DataError, match=r"c\.tsv:2: expected 'id<TAB>text'"):
        read_corpus(p)
    with pytest.raises(DataError, match="--format"):
        detect_format(tmp_path / "corpus.parquet")
    with pytest.raises(DataError, match="holds no usable passages"):
        q = tmp_path / "empty.tsv"
        q.write_text("a\t \n")
        read_corpus(q, on_error="skip")


def test_a_hostile_corpus_line_is_one_error_or_one_skip(tmp_path):
    """A line of 100,000 nested brackets was a RecursionError traceback and a 5,000-digit integer a
    ValueError; each is a bad line now, named or counted."""
    p = _jsonl(
        tmp_path / "c.jsonl",
        [
            {"id": "a", "text": "fine"},
            "[" * 100_000 + "]" * 100_000,
            '{"id": 1' + "0" * 5000 + ', "text": "x"}',
            {"id": "c", "text": "ok"},
        ],
    )
    with pytest.raises(DataError) as raised:
        read_corpus(p)
    assert str(raised.value).startswith(
        f"{p}:2: JSON nested too deep: at most 64 levels of arrays and objects (fix the line"
    )
    c = read_corpus(p, on_error="skip")
    assert c.docids == ["a", "c"]
    assert dict(c.stats.skipped) == {"invalid_json": 2}


def test_a_corpus_line_over_the_cap_or_not_utf8_is_one_error_or_one_skip(tmp_path):
    """The corpus reader had no line size cap (a 17 MB line was read, decoded and parsed whole) and
    a byte that is not UTF-8 was
    `not UTF-8 text ('utf-8' codec can't decode byte 0xe9 in position 8229 ...)`, a position in the
    file's read buffer. Each is a bad line now, named by line (and column), or skipped and
    counted."""
    p = tmp_path / "c.jsonl"
    p.write_bytes(
        b'{"id": "a", "text": "fine"}\n'
        + b'{"id": "big", "text": "'
        + b"x" * (17 * 1024 * 1024)
        + b'"}\n'
        + b'{"id": "b", "text": "caf\xe9"}\n'
        + b'{"id": "c", "text": "ok"}\n'
    )
    with pytest.raises(DataError) as raised:
        read_corpus(p)
    assert str(raised.value) == (
        f"{p}:2: a line over 16,777,216 bytes, the limit of a line of a corpus file (fix the "
        "line, or pass --on-error skip to skip bad lines and count them in the manifest)"
    )
    c = read_corpus(p, on_error="skip")
    assert c.docids == ["a", "c"]
    assert dict(c.stats.skipped) == {"line_too_long": 1, "not_utf8": 1}
    latin = tmp_path / "latin.tsv"
    latin.write_bytes(b"a\tfine\nb\tcaf\xe9 au lait\n")
    with pytest.raises(DataError) as raised:
        read_corpus(latin)
    assert str(raised.value).startswith(
        f"{latin}:2: not UTF-8 (byte 0xe9 at column 6): give the corpus file as UTF-8 (fix"
    )


def test_a_lone_carriage_return_still_ends_a_corpus_line(tmp_path):
    """The bounded reader numbers lines as the text reader it replaced (`newline=""`): a lone
    `\\r` ends a line, `\\r\\n` is one ending."""
    p = tmp_path / "c.tsv"
    p.write_bytes(b"a\tone\rb\ttwo\r\nc\tthree\n\nd\tfour")
    c = read_corpus(p)
    assert (c.docids, c.texts) == (["a", "b", "c", "d"], ["one", "two", "three", "four"])
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"a\tone\rno tab\nc\tthree\n")
    with pytest.raises(DataError, match=r"bad\.tsv:2: expected 'id<TAB>text'"):
        read_corpus(bad)
