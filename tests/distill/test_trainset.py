"""The student's training pool and pairs drawn from it with the project's own first stage."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cisrank.distill.sources import load_source
from cisrank.distill.trainset import TRIPLES, build_pool, content_id
from cisrank.errors import DataError
from cisrank.testing import SAMPLE_SENTENCES


def _pool(out: Path) -> dict[str, str]:
    lines = (out / "pool.jsonl").read_text(encoding="utf-8").splitlines()
    return {(row := json.loads(line))["id"]: row["text"] for line in lines}


def _with_triples(root: Path, rows: list[tuple[str, str, str]]) -> None:
    (root / TRIPLES).parent.mkdir(parents=True, exist_ok=True)
    (root / TRIPLES).write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


def test_the_pool_leaves_out_every_test_passage_by_content(data_sets, tmp_path):
    """The synthetic sets share sentences: every DL22 passage that DL19 or DL21 (the dev set)
    also holds (by text, whatever its id) is left out, DL21's own pool never enters, duplicates
    by text are kept once, the triples' passages join under content ids and their queries
    become the topics."""
    triples = [
        ("who wrote hamlet", "Hamlet was written by Shakespeare.", SAMPLE_SENTENCES[0]),
        ("who wrote hamlet", "Hamlet was written by Shakespeare.", "Fresh negative passage."),
        ("capital of peru", "Lima is the capital of Peru.", "Fresh negative passage."),
    ]
    _with_triples(data_sets, triples)
    info = build_pool(tmp_path / "pool", data_sets)
    pool = _pool(tmp_path / "pool")
    dl19 = {
        h["content"]
        for q in json.loads((data_sets / "trec-dl19" / "candidates-bm25-top100.json").read_text())
        for h in q["hits"]
    }
    held_out = {
        h["content"]
        for q in json.loads((data_sets / "trec-dl21" / "candidates-bm25-top100.json").read_text())
        for h in q["hits"]
    } | dl19
    assert dl19 and not held_out & set(pool.values())
    assert len(set(pool.values())) == len(pool) == info.passages
    assert info.excluded["msmarco-train"] == 1 and info.excluded["trec-dl22"] > 0
    assert set(info.by_source) == {"trec-dl22", "msmarco-train"}
    for text in ("Hamlet was written by Shakespeare.", "Lima is the capital of Peru."):
        assert pool[content_id("p", text)] == text
    topics = (tmp_path / "pool" / "topics.tsv").read_text().splitlines()
    assert topics == [
        f"{content_id('q', 'who wrote hamlet')}\twho wrote hamlet",
        f"{content_id('q', 'capital of peru')}\tcapital of peru",
    ]
    assert content_id("q", "x") == "q" + hashlib.sha1(b"x").hexdigest()[:16]
    # each triple's positive is its query's judged passage (once, however often it repeats)
    assert (tmp_path / "pool" / "qrels.txt").read_text().splitlines() == [
        f"{content_id('q', 'who wrote hamlet')} 0 {content_id('p', triples[0][1])} 1",
        f"{content_id('q', 'capital of peru')} 0 {content_id('p', triples[2][1])} 1",
    ]


def test_training_pairs_come_from_the_first_stage_over_the_pool(data_sets, tmp_path):
    from cisrank.indexes.build import build_index

    _with_triples(data_sets, [("hamlet author", "Hamlet was written by Shakespeare.", "No.")])
    build_pool(tmp_path / "pool", data_sets)
    build_index("bm25", tmp_path / "pool" / "pool.jsonl", tmp_path / "bm25", progress=False)
    source = load_source(
        topics=tmp_path / "pool" / "topics.tsv", first_stage=[tmp_path / "bm25"], depth=3
    )
    (q,) = source.queries
    assert q.query == "hamlet author" and q.ranks == list(range(1, len(q.ranks) + 1))
    assert q.docids[0] == content_id("p", "Hamlet was written by Shakespeare.")
    assert source.identity["first_stage"] == [str(tmp_path / "bm25")]
    with pytest.raises(DataError, match="needs --topics"):
        load_source(first_stage=[tmp_path / "bm25"], depth=3)
    with pytest.raises(DataError, match="exactly one of"):
        load_source(dataset="trec-dl22", first_stage=[tmp_path / "bm25"], depth=3)


@pytest.mark.shared_data
def test_the_real_pool_counts(data_root, tmp_path):
    """The figures bench/RESULTS.md records for the student's training pool: DL22's pool and
    the triples' passages, ten DL22 hits whose text is a DL21 candidate left out."""
    info = build_pool(tmp_path / "pool", data_root)
    assert info.to_json() == {
        "sets": ["trec-dl22"],
        "held_out": ["trec-dl19", "trec-dl21"],
        "passages": 7974,
        "by_source": {"trec-dl22": 6705, "msmarco-train": 1269},
        "excluded_by_content": {"trec-dl22": 10},
        "queries": 994,
    }
    with pytest.raises(DataError, match="both pooled and held out: trec-dl21"):
        build_pool(tmp_path / "bad", data_root, sets=("trec-dl21",))
    assert not (tmp_path / "bad").exists()
