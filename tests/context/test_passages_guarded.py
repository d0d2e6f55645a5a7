"""The passages file of `rerank`, `context` and `generate` is read as the API reads a body."""

import pytest

from cisrank.context.passages import read_scored_passages
from cisrank.data import datasets
from cisrank.errors import CisrankError


def test_a_line_over_the_cap_is_refused_naming_it_and_the_other_lines_read_as_before(
    tmp_path, monkeypatch
):
    """A passages line had no size cap (the whole file was `read_text`). The cap is the API's body
    size (16 MiB; 64 bytes here); lines end at \\n, \\r\\n or a lone \\r as before."""
    monkeypatch.setattr(datasets, "MAX_JSON_LINE_BYTES", 64)
    ok = tmp_path / "ok.txt"
    ok.write_bytes(b'plain one\r{"text": "two", "score": 2, "id": "t"}\r\nthree\n')
    docs, scores = read_scored_passages(ok)
    assert [(d.docid, d.text) for d in docs] == [("0", "plain one"), ("t", "two"), ("2", "three")]
    assert scores is None
    big = tmp_path / "big.jsonl"
    big.write_bytes(b'{"text": "fine"}\n{"text": "' + b"x" * 100 + b'"}\n{"text": "after"}\n')
    with pytest.raises(CisrankError) as raised:
        read_scored_passages(big)
    assert str(raised.value) == (
        f"{big}:2: a line over 64 bytes, the limit of a line of a passages file"
    )
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"text": "x", "id": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    monkeypatch.setattr(datasets, "MAX_JSON_LINE_BYTES", 16 * 1024 * 1024)
    with pytest.raises(CisrankError, match=r"deep\.jsonl:1: JSON nested too deep: at most 64"):
        read_scored_passages(deep)
