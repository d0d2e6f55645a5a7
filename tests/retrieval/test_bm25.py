"""Lucene-like analysis against Lucene's own output, and bm25s BM25 against hand and brute force."""

import json
import math
import random

import pytest

from cisrank.errors import CisrankError
from cisrank.indexes.build import build_index
from cisrank.indexes.kinds import open_index
from cisrank.retrieval.analysis import Analyzer, AnalyzerConfig

# Expected terms copied from pyserini's `Analyzer(get_lucene_analyzer()).analyze(...)`
# (Anserini DefaultEnglishAnalyzer, Lucene 9), run once on this machine.
LUCENE_TERMS = [
    ("The cat's hats are running fast", ["cat", "hat", "run", "fast"]),
    (
        "dogs run slowly. U.S. 3.14 don't e-mail",
        ["dog", "run", "slowli", "u.", "3.14", "don't", "e", "mail"],
    ),
    ("1,000 foo_bar a:b x.y Ünïcode café", ["1,000", "foo_bar", "a:b", "x.y", "ünïcode", "café"]),
    ("what is wifi vs bluetooth", ["what", "wifi", "vs", "bluetooth"]),
    ("why did the us volunterilay enter ww1", ["why", "did", "us", "volunterilai", "enter", "ww1"]),
    ("tracheids are part of _____.", ["tracheid", "part"]),
    ("donâ€™t", ["donâ", "™", "t"]),
    ("entomology, possibly, terribly", ["entomolog", "possibl", "terribl"]),
    ("at 11:56pm intercourse.3", ["11", "56pm", "intercours", "3"]),
]


@pytest.mark.parametrize(("text", "terms"), LUCENE_TERMS)
def test_analysis_matches_lucene(text, terms):
    assert Analyzer().analyze(text) == terms


def test_analysis_options():
    assert Analyzer(AnalyzerConfig(stopwords="none", stemmer="none")).analyze("The Cats") == [
        "the",
        "cats",
    ]
    with pytest.raises(CisrankError, match="unknown stemmer"):
        Analyzer(AnalyzerConfig(stemmer="krovetz"))


TINY = [
    ("d1", "the cat sat on the mat"),  # cat sat mat          (3 terms)
    ("d2", "cats chase the dogs"),  # cat chase dog           (3)
    ("d3", "a dog barks at the mailman's dog"),  # dog bark mailman dog (4)
    ("d4", "birds sing"),  # bird sing                        (2)
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in rows))
    return path


@pytest.fixture(scope="module")
def tiny_bm25(tmp_path_factory):
    root = tmp_path_factory.mktemp("bm25")
    corpus = _write_jsonl(root / "tiny.jsonl", TINY)
    build_index("bm25", corpus, root / "idx", progress=False)
    return open_index(root / "idx")


def test_tiny_ranking_by_hand(tiny_bm25):
    # N=4, avgdl=3, k1=0.9, b=0.4; idf(cat)=idf(dog)=ln(1 + 2.5/2.5)=ln 2.
    # d2: 2 * ln2 * 1/(1+0.9) ; d3: ln2 * 2/(2 + 0.9*(0.6+0.4*4/3)) ; d1: ln2 * 1/1.9
    ln2 = math.log(2)
    expected = [("d2", 2 * ln2 / 1.9), ("d3", ln2 * 2 / 3.02), ("d1", ln2 / 1.9)]
    hits = tiny_bm25.search("Dog and CAT", k=10)
    assert [h.docid for h in hits] == [d for d, _ in expected]  # d4 matches nothing: absent
    for h, (_, s) in zip(hits, expected, strict=True):
        assert h.score == pytest.approx(s, rel=1e-6)
    assert hits[1].text == "a dog barks at the mailman's dog"
    assert tiny_bm25.search("the of and", k=5) == []  # only stop words: no match
    assert [h.docid for h in tiny_bm25.search("cat", k=1)] == ["d1"]  # tie d1/d2 -> lower doc


def _brute_force(docs_terms, query_terms, k1=0.9, b=0.4):
    n = len(docs_terms)
    avgdl = sum(map(len, docs_terms)) / n
    scores = []
    for i, terms in enumerate(docs_terms):
        s = 0.0
        for q in query_terms:
            tf = terms.count(q)
            if tf:
                df = sum(1 for t in docs_terms if q in t)
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                s += idf * tf / (tf + k1 * (1 - b + b * len(terms) / avgdl))
        if s > 0:
            scores.append((i, s))
    return sorted(scores, key=lambda p: (-p[1], p[0]))


def test_random_corpus_against_brute_force(tmp_path):
    rng = random.Random(3)
    words = [f"w{i}" for i in range(30)]
    rows = [(f"doc{i}", " ".join(rng.choices(words, k=rng.randint(1, 12)))) for i in range(60)]
    _write_jsonl(tmp_path / "r.jsonl", rows)
    build_index(
        "bm25", tmp_path / "r.jsonl", tmp_path / "idx", {"k1": 1.2, "b": 0.75}, progress=False
    )
    r = open_index(tmp_path / "idx")
    analyzer = Analyzer()
    docs_terms = [analyzer.analyze(t) for _, t in rows]
    queries = [" ".join(rng.choices(words, k=3)) for _ in range(10)]
    for q, hits in zip(queries, r.batch_search(queries, k=15), strict=True):
        ref = _brute_force(docs_terms, analyzer.analyze(q), 1.2, 0.75)[:15]
        got = [(h.docid, h.score) for h in hits]
        assert len(got) == len(ref)
        for (d, s), (i, rs) in zip(got, ref, strict=True):
            assert s == pytest.approx(rs, rel=1e-5)
            if d != rows[i][0]:  # only a float32 near-tie may swap neighbours
                assert s == pytest.approx(dict(got).get(rows[i][0], -1), rel=1e-5)


def test_ties_at_the_cut_go_to_the_lowest_document_number(tmp_path):
    # 40 passages score the same for "apple"; the top 5 must be the first five, not any five
    rows = [(f"t{i:02d}", f"apple pie number{i}") for i in range(40)]
    rows.insert(0, ("best", "apple apple"))
    _write_jsonl(tmp_path / "ties.jsonl", rows)
    build_index("bm25", tmp_path / "ties.jsonl", tmp_path / "idx", progress=False)
    hits = open_index(tmp_path / "idx").search("apple", k=5)
    assert [h.docid for h in hits] == ["best", "t00", "t01", "t02", "t03"]


def test_memory_bm25_ranks_like_a_built_index(tmp_path):
    from cisrank.retrieval.bm25 import BM25IndexConfig, MemoryBM25

    rng = random.Random(5)
    words = [f"w{i}" for i in range(25)]
    rows = [(f"doc{i}", " ".join(rng.choices(words, k=rng.randint(1, 10)))) for i in range(50)]
    rows += [(f"tie{i}", "w1 w2") for i in range(4)]
    _write_jsonl(tmp_path / "m.jsonl", rows)
    build_index("bm25", tmp_path / "m.jsonl", tmp_path / "idx", {"k1": 1.2}, progress=False)
    built = open_index(tmp_path / "idx")
    memory = MemoryBM25([t for _, t in rows], [d for d, _ in rows], BM25IndexConfig(k1=1.2, b=0.4))
    for q in ["w1 w2", "w3", "w7 w9 w1", "nothing here"]:
        want = [(h.docid, h.score) for h in built.search(q, k=12)]
        got = [(h.docid, h.score) for h in memory.search(q, k=12)]
        assert [d for d, _ in got] == [d for d, _ in want], q
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-6)
    with pytest.raises(CisrankError, match="at least one passage"):
        MemoryBM25([])
