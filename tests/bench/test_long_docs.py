"""bench/long_docs.py: judged passages padded by unrelated ones, the passage intact at its place."""

from __future__ import annotations

import random

import pytest
from builders import write_set

from cisrank.data.datasets import load_folder

FILLER = [f"filler passage {i} " + "word " * (3 + i % 4) for i in range(40)]


@pytest.fixture(scope="module")
def long_docs(bench_script):
    return bench_script("long_docs")


@pytest.mark.parametrize("position", ["start", "middle", "end"])
def test_the_passage_is_kept_whole_at_its_place_among_distinct_fillers(long_docs, position):
    text = "the judged passage itself"
    out = long_docs.pad(text, FILLER, position, random.Random(7), 60)
    parts = out.split("\n\n")
    assert parts.count(text) == 1
    others = [p for p in parts if p != text]
    assert len(set(others)) == len(others) and set(others) <= set(FILLER)
    assert len(out.split()) >= 60
    assert len(" ".join(others).split()) - max(len(p.split()) for p in others) < 60 - 4
    where = parts.index(text)
    assert where == {"start": 0, "middle": len(others) // 2, "end": len(others)}[position]


def test_a_passage_long_enough_is_unchanged_and_short_filler_is_an_error(long_docs):
    text = "word " * 80
    assert long_docs.pad(text, FILLER, "end", random.Random(0), 50) == text
    with pytest.raises(ValueError, match="too few words"):
        long_docs.pad("x", FILLER[:2], "end", random.Random(0), 500)
    with pytest.raises(ValueError, match="position"):
        long_docs.pad("x", FILLER, "anywhere", random.Random(0), 5)


def test_the_folder_reads_back_judged_padded_and_the_same_for_a_seed(long_docs, tmp_path):
    src = write_set(tmp_path / "data", "trec-dl21", ["105", "106"], depth=3)
    filler = write_set(tmp_path / "data", "trec-dl22", ["101", "102", "103"], depth=6, judged=False)
    a = long_docs.write(src, tmp_path / "a", filler, "middle", seed=3, words=(20, 30))
    b = long_docs.write(src, tmp_path / "b", filler, "middle", seed=3, words=(20, 30))
    assert (a / "candidates-bm25-top100.json.gz").is_file()
    orig, pa, pb = load_folder(src), load_folder(a), load_folder(b)
    assert pa.qids == orig.qids and pa.qrels == orig.qrels and pa.topics == orig.topics
    for q in orig.qids:
        own = {h.text for h in orig.candidates[q]}
        for h0, h1, h2 in zip(orig.candidates[q], pa.candidates[q], pb.candidates[q], strict=True):
            assert (h1.docid, h1.rank, h1.score) == (h0.docid, h0.rank, h0.score)
            assert h1.text == h2.text  # the seed decides
            parts = h1.text.split("\n\n")
            assert parts.count(h0.text) == 1 and len(h1.text.split()) >= 20
            assert not (set(parts) - {h0.text}) & own  # no filler from the query's own list
