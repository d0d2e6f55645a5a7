"""Teacher sets: components packed by (qid, docid), provenance kept, text joined back by id,
labels fused per query, and a listwise student that learns the fused teacher."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from cisrank.distill import teacher_set as TS
from cisrank.distill.config import TrainConfig
from cisrank.distill.generate import generate
from cisrank.distill.losses import load_loss
from cisrank.distill.sources import load_source
from cisrank.distill.teachers import load_teacher
from cisrank.distill.train import load_teacher_sets, train
from cisrank.errors import DataError
from cisrank.fusion import fuse


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


def test_a_set_of_written_queries_carries_their_text(packed, data_sets, tmp_path):
    """Queries the project wrote (distill synth) are in no data folder: the set carries them,
    and they win over a data folder's text of the same qid; passages are joined back by id."""
    source, _, _ = packed
    cis = tmp_path / "rows-cis"
    path = tmp_path / "with.parquet"
    ts = TS.pack({"cis": cis}, path, {"dataset": "trec-dl22"}, with_queries=True)
    assert pq.read_table(path).column_names == ["qid", "docid", "rank", "query", "cis"]
    assert ts.components == ["cis"] and ts.queries == {q.qid: q.query for q in source.queries}
    renamed = TS.Texts({q.qid: "another text" for q in source.queries}, {})
    texts = TS.texts_of(TS.load(path))
    attached = TS.attach_text(TS.load(path), TS.Texts(renamed.queries, texts.passages))
    assert [a["query"] for a in attached] == [q.query for q in source.queries]
    assert [a["passages"] for a in attached] == [q.passages for q in source.queries]


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
    options = TrainConfig(loss="listwise", normalize="query", seed=0, temperature=0.5)
    ex = load_loss("listwise").examples(queries, options)
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


def _rewrite(path, out, *, rows=None, metadata=None, change=None):
    """A copy of a packed set with its table or its provenance changed as a user's tools might."""
    import pyarrow as pa

    table = pq.read_table(path)
    if rows is not None:
        table = rows(table)
    if change is not None:
        table = change(table)
    meta = dict(table.schema.metadata or pq.read_table(path).schema.metadata)
    if metadata is not None:
        meta[TS.METADATA_KEY] = metadata
    pq.write_table(table.replace_schema_metadata(meta), out)
    assert isinstance(table, pa.Table)
    return out


def _cases(ts, source):
    """label -> (how to rewrite the packed set, what the one line says)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(ts)
    first = ts.by_query()[source.queries[0].qid]
    queries = len(source.queries)

    def column(name, values):
        return lambda t: t.set_column(t.column_names.index(name), name, values)

    return {
        "no rows": (dict(rows=lambda t: t.slice(0, 0)), "holds no pairs: nothing to train on"),
        "not json": (
            dict(metadata=b"{not json"),
            "its provenance (Parquet metadata 'cisrank') is not JSON: pack it again with "
            "`cisrank distill pack`",
        ),
        "nested too deep": (  # a RecursionError traceback before
            dict(metadata=b"[" * 100_000 + b"]" * 100_000),
            "its provenance (Parquet metadata 'cisrank') is not JSON: pack it again with "
            "`cisrank distill pack`",
        ),
        "a json list": (
            dict(metadata=b"[1, 2]"),
            "its provenance (Parquet metadata 'cisrank') is a JSON list, not an object",
        ),
        "string scores": (
            dict(change=lambda t: column("cis", pc.cast(t["cis"], pa.string()))(t)),
            "column 'cis' holds string, not numbers",
        ),
        "all equal": (
            dict(change=column("cis", pa.array([1.5] * n, pa.float32()))),
            f"component 'cis' is constant (all its {n} scores are 1.5): nothing to learn",
        ),
        "equal within each query": (
            dict(change=column("cis", pa.array([float(q[-1]) for q in ts.qid], pa.float32()))),
            "component 'cis' is constant (it scores the passages of each query alike)",
        ),
        "a duplicated row": (
            dict(rows=lambda t: pa.concat_tables([t, t.slice(first[1], 1)])),
            f"passage {ts.docid[first[1]]} is in rows {first[1]} and {n}: each pair once",
        ),
        "a single pair": (
            dict(rows=lambda t: t.slice(first[0], 1)),
            "every query has fewer than two passages (1 pair(s) over 1 queries)",
        ),
        "one passage a query": (
            dict(rows=lambda t: t.filter(pc.equal(t["rank"], 1))),
            f"every query has fewer than two passages ({queries} pair(s) over {queries} queries)",
        ),
    }


CASES = [
    "no rows",
    "not json",
    "nested too deep",
    "a json list",
    "string scores",
    "all equal",
    "equal within each query",
    "a duplicated row",
    "a single pair",
    "one passage a query",
]


@pytest.mark.parametrize("label", CASES)
def test_a_broken_or_degenerate_teacher_set_is_refused_in_one_line_before_training(
    label, packed, tiny_bert_dir, tmp_path, monkeypatch, capsys
):
    """`distill train --teacher-set` with 0 rows was transformers' `max_steps` ValueError, metadata
    that is not JSON or a JSON list a traceback, a string score column a ValueError; constant
    scores, duplicated rows and a single pair trained silently. Each is one line and exit 2 now,
    before a model loads or anything is written."""
    from cli.helpers import main_in_process

    source, ts, path = packed
    how, message = _cases(ts, source)[label]
    bad = _rewrite(path, tmp_path / "bad.parquet", **how)
    out = tmp_path / "student"
    args = ["distill", "train", "--teacher-set", str(bad), "--out", str(out)]
    run = main_in_process(
        monkeypatch, capsys, *args, "--base-model", str(tiny_bert_dir), "--dev-dataset", "none"
    )
    assert run.code == 2 and "Traceback" not in run.err, run.err
    assert run.last_line.startswith(f"error: teacher set '{bad}'"), run.last_line
    assert message in run.last_line, run.last_line
    assert not out.exists()


def test_a_sampled_set_trains_on_the_seeded_queries_nested_across_sizes(packed):
    source, _, path = packed
    qids = sorted(q.qid for q in source.queries)
    assert len(qids) >= 3
    whole = {q["query"]: q for q in load_teacher_sets([path])}
    drawn = {}
    for n in (1, 2):
        got = load_teacher_sets([f"{path}@{n}"], seed=7)
        # the first n of the seed's shuffle of the sorted qids, computed here apart
        want = {qids[i] for i in np.random.default_rng(7).permutation(len(qids))[:n]}
        topic = {q.qid: q.query for q in source.queries}
        assert {topic[q] for q in want} == {q["query"] for q in got}
        for q in got:  # each sampled query's whole list, as the unsampled set gives it
            assert q == whole[q["query"]]
        drawn[n] = {q["query"] for q in got}
    assert drawn[1] < drawn[2]  # a learning curve's points are nested
    assert len(load_teacher_sets([f"{path}@{len(qids) + 5}"], seed=7)) == len(qids)
    with pytest.raises(DataError, match="at least one query"):
        load_teacher_sets([f"{path}@0"])
