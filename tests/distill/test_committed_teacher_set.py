"""The teacher sets the repository carries (`teachers/`, what `make student` trains on): readable,
ids and scores only, their provenance complete, and every id found again in the data the set
names: the training pool that `distill pool` rebuilds from the real data, or DL22's BM25 run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cisrank.distill import teacher_set as TS
from cisrank.distill.trainset import build_pool

TEACHERS = Path(__file__).resolve().parents[2] / "teachers"
TRAIN = TEACHERS / "msmarco-train-top20.parquet"
DL22 = TEACHERS / "trec-dl22-bm25-top100.parquet"
SHIPPED = TEACHERS / "shipped-student-msmarco-top20.parquet"
"""The set the shipped student was trained on, drawn from a pool that held DL21's candidates."""
SHIPPED_POOL = {"sets": ("trec-dl21", "trec-dl22"), "held_out": ("trec-dl19",)}


def _lists_ranked(ts: TS.TeacherSet, queries: int, depth: int) -> None:
    lists = ts.by_query()
    assert len(lists) == queries and max(len(v) for v in lists.values()) == depth
    for rows in lists.values():  # each query's list is its first-stage top, ranks 1..n
        assert [ts.rank[i] for i in rows] == list(range(1, len(rows) + 1))
    assert all(np.isfinite(v).all() for v in ts.scores.values())
    assert ts.provenance["commit"]


def test_the_msmarco_set_names_its_teachers_and_holds_no_text():
    ts = TS.load(TRAIN)
    assert len(ts) == 19_880 and ts.components == ["dense", "qrels"]
    _lists_ranked(ts, 994, 20)
    components = ts.provenance["components"]
    assert components["dense"]["teacher"] == {"model": "all-mpnet-base-v2", "teacher": "dense"}
    assert components["qrels"]["teacher"]["teacher"] == "qrels"
    assert set(np.unique(ts.scores["qrels"])) == {0.0, 1.0}  # the triples' positives, graded 1
    source = components["dense"]["source"]
    assert source["retriever"] == "rrf(bm25,dense)" and source["depth"] == 20


@pytest.mark.parametrize(
    ("path", "pairs", "queries", "depth"),
    [(DL22, 7_600, 76, 100), (SHIPPED, 19_880, 994, 20)],
    ids=["trec-dl22", "shipped-student"],
)
def test_the_cis_sets_name_their_teachers_and_hold_no_text(path, pairs, queries, depth):
    ts = TS.load(path)
    assert len(ts) == pairs and ts.components == ["cis", "dense"]
    _lists_ranked(ts, queries, depth)
    cis = ts.provenance["components"]["cis"]["teacher"]
    assert (cis["model"], cis["backend"], cis["dtype"], cis["estimator"]) == (
        "smollm2-135m-instruct",
        "onnx",
        "int8",
        "reverse",
    )
    assert cis["reverse_template"] == "upr" and len(cis["fingerprint"]) == 64


def test_the_sets_name_one_dense_teacher_and_one_cis_engine():
    """Fused and normalised alike where a student takes two, so all name one bi-encoder, and
    the two with CIS one engine: model, backend, compute type, template (the fingerprint). The
    host's int8 kernels are not in it: the two were scored on an AVX2 and an AVX-512 VNNI host
    (teachers/README.md)."""
    sets = [TS.load(p) for p in (TRAIN, DL22, SHIPPED)]
    models = {ts.provenance["components"]["dense"]["teacher"]["model"] for ts in sets}
    assert models == {"all-mpnet-base-v2"}
    engines = {ts.provenance["components"]["cis"]["teacher"]["fingerprint"] for ts in sets[1:]}
    assert len(engines) == 1


def test_every_id_is_found_in_the_pool_rebuilt_from_the_data(data_root, tmp_path):
    ts = TS.load(TRAIN)
    build_pool(tmp_path / "pool", data_root)
    texts = TS.texts_of(ts, tmp_path / "pool")
    assert set(ts.qid) <= set(texts.queries)
    assert set(ts.docid) <= set(texts.passages)
    positives = {(q, d) for q, d, g in zip(ts.qid, ts.docid, ts.scores["qrels"], strict=True) if g}
    triples = {
        tuple(line.split()[::2][:2])
        for line in (tmp_path / "pool" / "qrels.txt").read_text().splitlines()
    }
    assert positives <= triples  # every graded pair is a training triple's positive


def test_the_shipped_students_set_is_found_in_the_pool_it_was_drawn_from(data_root, tmp_path):
    """`make student` rebuilds that pool (`distill pool --pool-sets ... --held-out ...`); the
    default pool, without DL21's candidates, lacks some of its passages."""
    ts = TS.load(SHIPPED)
    info = build_pool(tmp_path / "old", data_root, **SHIPPED_POOL)
    assert info.passages == 12_478
    texts = TS.texts_of(ts, tmp_path / "old")
    assert set(ts.qid) <= set(texts.queries) and set(ts.docid) <= set(texts.passages)
    build_pool(tmp_path / "new", data_root)
    lines = (tmp_path / "new" / "pool.jsonl").read_text(encoding="utf-8").splitlines()
    assert not set(ts.docid) <= {json.loads(line)["id"] for line in lines}


def test_the_dl22_set_is_dl22s_bm25_top_100_rank_for_rank(data_root, monkeypatch):
    """Read against the run file itself, not through the loader that built the set."""
    monkeypatch.setenv("CISRANK_DATA_DIR", str(data_root))  # where texts_of finds the dataset
    ts = TS.load(DL22)
    assert ts.provenance["texts"] == {"dataset": "trec-dl22"}
    run = {}
    for line in (data_root / "trec-dl22" / "run-bm25-top100.trec").read_text().splitlines():
        qid, _, docid, rank, *_ = line.split()
        run[(qid, docid)] = int(rank)
    assert dict(zip(zip(ts.qid, ts.docid, strict=True), ts.rank, strict=True)) == run
    texts = TS.texts_of(ts)
    assert set(ts.qid) <= set(texts.queries) and set(ts.docid) <= set(texts.passages)


SYNTH = {
    TEACHERS / "synth-smollm2-pool-top20.parquet": 4_300,
    TEACHERS / "synth-qwen-pool-top20.parquet": 3_195,
}
"""Queries `distill synth` wrote from the training pool's passages (SmolLM2-135M-Instruct for all
7,974, Qwen2.5-Coder-0.5B-Instruct for the first 5,184 of the same seeded order), one a passage,
kept where RRF(BM25, MiniLM) ranks their source first: the set and its kept count."""
SYNTH_IDS = [p.stem for p in SYNTH]


def _squashed(text: str) -> str:
    return " ".join(text.split()).casefold()


@pytest.mark.parametrize(("path", "kept"), list(SYNTH.items()), ids=SYNTH_IDS)
def test_the_synthetic_set_carries_its_queries_and_their_sources(path, kept):
    ts = TS.load(path)
    assert ts.components == ["dense", "minilm", "qrels"]
    _lists_ranked(ts, kept, 20)
    assert ts.queries is not None and set(ts.queries) == set(ts.qid)
    assert all(q.strip() for q in ts.queries.values())
    teachers = {k: v["teacher"] for k, v in ts.provenance["components"].items()}
    assert teachers["dense"] == {
        "backend": "onnx",
        "dtype": "float32",
        "model": "all-mpnet-base-v2",
        "teacher": "dense",
    }
    assert teachers["minilm"]["model"] == "all-MiniLM-L6-v2"
    # a query's one graded pair is the passage it was written from (qid "<docid>#q0"), ranked
    # first by the round-trip filter
    graded = [i for i, g in enumerate(ts.scores["qrels"]) if g]
    assert len(graded) == kept and set(np.unique(ts.scores["qrels"])) == {0.0, 1.0}
    assert all(ts.qid[i] == f"{ts.docid[i]}#q0" and ts.rank[i] == 1 for i in graded)


@pytest.mark.parametrize("path", list(SYNTH), ids=SYNTH_IDS)
def test_no_synthetic_query_is_an_evaluation_query(path, data_root, tmp_path):
    """The data rules, checked here against the topic files themselves: no DL19 or DL21 query
    (case and spacing aside) is among the written queries, and every passage is in the pool
    that leaves DL19's and DL21's passages out by text."""
    ts = TS.load(path)
    held = set()
    for name in ("trec-dl19", "trec-dl21"):
        for line in (data_root / name / "topics.tsv").read_text(encoding="utf-8").splitlines():
            held.add(_squashed(line.split("\t", 1)[1]))
    assert len(held) == 96
    assert ts.queries is not None and not {_squashed(q) for q in ts.queries.values()} & held
    build_pool(tmp_path / "pool", data_root)
    texts = TS.texts_of(ts, tmp_path / "pool")
    assert set(ts.docid) <= set(texts.passages)
