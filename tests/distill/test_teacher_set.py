"""Teacher sets: components packed by (qid, docid), provenance kept, text joined back by id,
labels fused per query, and a listwise student that learns the fused teacher."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from cisrank.data.fusion import fuse
from cisrank.distill import teacher_set as TS
from cisrank.distill.generate import generate
from cisrank.distill.sources import load_source
from cisrank.distill.teachers import load_teacher
from cisrank.distill.train import TrainConfig, build_examples, load_teacher_sets, train
from cisrank.errors import DataError


def _component(source, tmp_path, name, score):
    run = tmp_path / f"{name}.trec"
    run.write_text(
        "".join(
            f"{q.qid} Q0 {d} {r} {score(n, int(d[1:]))} t\n"
            for n, q in enumerate(source.queries)
            for r, d in enumerate(q.docids, 1)
        )
    )
    out = tmp_path / f"rows-{name}"
    generate(source, load_teacher("scores", scores_file=run), out, progress=False)
    return out


@pytest.fixture
def packed(data_sets, tmp_path, monkeypatch):
    monkeypatch.setenv("CISRANK_DATA_DIR", str(data_sets))
    source = load_source(dataset="trec-dl22", data_dir=data_sets / "trec-dl22", depth=5)
    cis = _component(source, tmp_path, "cis", lambda n, d: 3.0 * d + 10 * n)
    dense = _component(source, tmp_path, "dense", lambda n, d: -0.1 * d + 0.01 * n)
    path = tmp_path / "set.parquet"
    ts = TS.pack({"cis": cis, "dense": dense}, path, {"dataset": "trec-dl22"}, note="test")
    return source, ts, path


def test_a_packed_set_holds_ids_scores_and_provenance_never_text(packed):
    source, ts, path = packed
    table = pq.read_table(path)
    assert table.column_names == ["qid", "docid", "rank", "cis", "dense"]
    assert len(ts) == source.num_pairs and ts.components == ["cis", "dense"]
    for q in source.queries:
        rows = ts.by_query()[q.qid]
        assert [ts.docid[i] for i in rows] == q.docids and [ts.rank[i] for i in rows] == q.ranks
    first = source.queries[0]
    i = ts.by_query()[first.qid][2]
    assert ts.scores["cis"][i] == pytest.approx(3.0 * int(first.docids[2][1:]))
    assert ts.provenance["components"]["cis"]["teacher"]["teacher"] == "scores"
    assert ts.provenance["texts"] == {"dataset": "trec-dl22"} and ts.provenance["pairs"] == len(ts)
    raw = path.read_bytes()
    assert all(p.encode() not in raw for q in source.queries for p in q.passages)


def test_text_is_joined_back_and_labels_are_fused_per_query(packed):
    source, ts, path = packed
    queries = load_teacher_sets([path], "cis:1,dense:0.5", "zscore")
    by_text = {q.query: q for q in source.queries}
    assert len(queries) == len(source.queries)
    for got in queries:
        q = by_text[got["query"]]
        assert got["passages"] == q.passages
        rows = ts.by_query()[q.qid]
        parts = [[float(ts.scores[c][i]) for i in rows] for c in ("cis", "dense")]
        assert got["scores"] == pytest.approx(fuse(parts, [1, 0.5], "linear", "zscore"))
    alone = load_teacher_sets([path])  # the first component when no fusion is named
    assert alone[0]["scores"] == pytest.approx(
        [float(ts.scores["cis"][i]) for i in ts.by_query()[source.queries[0].qid]]
    )
    with pytest.raises(DataError, match="no component bm25"):
        load_teacher_sets([path], "cis:1,bm25:1")


def test_components_over_other_pairs_are_refused(data_sets, tmp_path):
    source = load_source(dataset="trec-dl22", data_dir=data_sets / "trec-dl22", depth=5)
    fewer = load_source(dataset="trec-dl22", data_dir=data_sets / "trec-dl22", depth=4)
    a = _component(source, tmp_path, "a", lambda n, d: d)
    b = _component(fewer, tmp_path, "b", lambda n, d: d)
    with pytest.raises(DataError, match="not score the same pairs"):
        TS.pack({"a": a, "b": b}, tmp_path / "x.parquet", {"dataset": "trec-dl22"})
    (tmp_path / "empty.parquet").write_bytes(b"")
    with pytest.raises(DataError, match="not readable Parquet"):
        TS.load(tmp_path / "empty.parquet")
    pq.write_table(pq.read_table(a / "shard-00000.parquet"), tmp_path / "plain.parquet")
    with pytest.raises(DataError, match="not a cisrank teacher set"):
        TS.load(tmp_path / "plain.parquet")


def test_listwise_examples_are_each_querys_list_with_tempered_labels():
    queries = [
        {"query": "a", "passages": ["p1", "p2", "p3"], "scores": [3.0, 1.0, 2.0]},
        {"query": "b", "passages": ["x"], "scores": [1.0]},  # a list of one teaches nothing
    ]
    ex = build_examples(queries, "listwise", "query", 1, 0, temperature=0.5)
    z = (np.array([3.0, 1.0, 2.0]) - 2.0) / np.std([3.0, 1.0, 2.0])
    assert ex.columns["query"] == ["a"] and ex.columns["docs"] == [["p1", "p2", "p3"]]
    assert ex.columns["labels"][0] == pytest.approx((z / 0.5).tolist()) and len(ex) == 1


def test_a_listwise_student_learns_the_fused_teacher(packed, data_sets, tiny_bert_dir, tmp_path):
    from scipy.stats import spearmanr
    from sentence_transformers.cross_encoder import CrossEncoder

    source, _, path = packed
    cfg = TrainConfig(
        base_model=str(tiny_bert_dir),
        loss="listwise",
        teacher_fuse="cis:1,dense:0.5",
        list_depth=4,
        epochs=40,
        learning_rate=1e-3,
        batch_size=2,
        max_length=64,
        warmup_ratio=0.0,
        logging_steps=10,
        dev_dataset="none",
    )
    record = train([], tmp_path / "student", cfg, None, teacher_sets=[path])
    assert record["examples"] == len(source.queries) and record["queries"] == len(source.queries)
    student = CrossEncoder(str(tmp_path / "student"))
    rhos = []
    for got in load_teacher_sets([path], "cis:1,dense:0.5"):
        top = got["passages"][:4]
        pred = student.predict([(got["query"], p) for p in top])
        rhos.append(spearmanr(pred, got["scores"][:4])[0])
    assert np.mean(rhos) > 0.6, rhos
