"""bench/long_docs.py: judged passages padded by unrelated ones, the passage intact at its place."""

from __future__ import annotations

import random

import pytest
from builders import write_set

from cisrank.data.datasets import load_folder
from cisrank.rerank.chunking import PassageWindow, Splitter

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


@pytest.fixture(scope="module")
def long_eval(bench_script):
    return bench_script("long_docs_eval")


class FourWords:
    """A reranker that reads 4 words of a passage and scores the count of `hamlet` in them."""

    passage_window = PassageWindow(4, None)
    model_name = "four-words"

    def score(self, query, passages):
        return [float(p.split().count("hamlet")) for p in passages]


def test_the_three_poolings_are_pooled_from_one_scoring_of_every_window(long_eval):
    """Windows of 4 words, no overlap: "a b hamlet hamlet | c d e hamlet | f" scores
    [2, 1, 0]: first 2, max 2, mean 1; "hamlet x y z | hamlet hamlet hamlet w" [1, 3]."""
    texts = ["a b hamlet hamlet c d e hamlet f", "hamlet x y z hamlet hamlet hamlet w", "q"]
    scores, spans, _ = long_eval.score_query(FourWords(), Splitter(None), "hamlet", texts, 0)
    assert scores == [[2.0, 1.0, 0.0], [1.0, 3.0], [0.0]]
    assert [texts[0][a:b] for a, b in spans[0]] == ["a b hamlet hamlet", "c d e hamlet", "f"]
    row = {"qid": "1", "docids": ["d0", "d1", "d2"], "scores": scores, "spans": spans}
    runs = {p: long_eval.pooled_run({"1": row}, p).as_dict()["1"] for p in long_eval.POOLINGS}
    assert runs["first"] == {"d0": 2.0, "d1": 1.0, "d2": 0.0}
    assert runs["max"] == {"d0": 2.0, "d1": 3.0, "d2": 0.0}
    assert runs["mean"] == {"d0": 1.0, "d1": 2.0, "d2": 0.0}


def test_a_torn_last_line_is_dropped_and_the_rest_resumes(long_eval, tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text('{"qid": "1", "scores": []}\n{"qid": "2", "sco', encoding="utf-8")
    assert list(long_eval.done_queries(log)) == ["1"]
    assert long_eval.done_queries(tmp_path / "missing.jsonl") == {}


@pytest.fixture(scope="module")
def long_nq(bench_script):
    return bench_script("long_docs_nq")


def test_the_gold_figures_count_recall_at_k_and_mrr_by_hand(long_nq):
    """Two questions, three candidates each: window scores pooled first/max. Question a: gold 2,
    windows [[1], [0], [0, 5]]: first ranks the gold 3rd (1 > 0 = 0: ties by index, 1 before
    2), max 1st. Question b: gold 0, [[0, 0], [3], [1]]: the gold 3rd either way."""
    one, two = [[0, 1]], [[0, 1], [1, 2]]
    rows = [
        {"gold": 2, "scores": [[1.0], [0.0], [0.0, 5.0]], "spans": [one, one, two]},
        {"gold": 0, "scores": [[0.0, 0.0], [3.0], [1.0]], "spans": [two, one, one]},
    ]
    first = long_nq.gold_figures(rows, "first")
    assert first == {
        "gold_recall@1": 0.0,
        "gold_recall@3": 1.0,
        "gold_recall@5": 1.0,
        "MRR": pytest.approx((1 / 3 + 1 / 3) / 2),
    }
    best = long_nq.gold_figures(rows, "max")
    assert best["gold_recall@1"] == 0.5 and best["MRR"] == pytest.approx((1 + 1 / 3) / 2)


def test_a_buried_candidate_keeps_its_text_and_no_filler_holds_an_answer(long_nq):
    from cisrank.data.types import Passage
    from cisrank.eval.rag.answers import normalize_answer
    from cisrank.eval.rag.questions import CandidateSet, Question

    gold = Passage("g", "Shakespeare was born in 1564.", "Hamlet")
    q = Question(0, "when was shakespeare born", ["1564"], gold)
    cs = CandidateSet(q, [gold, Passage("o", "Paris is in France.")], 0)
    words = "lorem ipsum dolor sit amet " * 60
    filler = [f"{words} {i}" for i in range(40)] + ["the year 1564 was long"] * 40
    texts, sizes = long_nq.buried(cs, [(t, normalize_answer(t)) for t in filler], "end", 0)
    assert [t.split("\n\n")[-1] for t in texts] == cs.texts  # at the end, intact
    assert all(t.count("1564") == c.count("1564") for t, c in zip(texts, cs.texts, strict=True))
    assert all(n >= 1000 for n in sizes) and sizes == [len(t.split()) for t in texts]
