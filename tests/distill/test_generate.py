"""Teacher rows: exact values, shards, resume after an interruption, refusal to mix runs."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cisrank.distill import rows as R
from cisrank.distill.generate import generate
from cisrank.distill.sources import from_triples, load_source
from cisrank.distill.teachers import TeacherScores, load_teacher
from cisrank.errors import DataError
from cisrank.rerank.cis import CISReranker


@pytest.fixture
def source(data_sets):
    return load_source(dataset="trec-dl22", data_dir=data_sets / "trec-dl22", depth=4)


@pytest.fixture
def cis_teacher(tiny_gpt2_dir):
    return load_teacher("cis", str(tiny_gpt2_dir), template="qa", estimator="forward")


def test_cis_rows_hold_the_three_terms_of_an_independent_reranker(
    source, cis_teacher, tiny_gpt2_dir, tmp_path
):
    res = generate(source, cis_teacher, tmp_path / "rows", shard_pairs=12, progress=False)
    table = R.read_rows(tmp_path / "rows").to_pylist()
    assert res.manifest["pairs"] == len(table) == 16 and res.manifest["shards"] == 2
    assert sorted(p.name for p in (tmp_path / "rows").iterdir()) == [
        "manifest.json",
        "shard-00000.parquet",
        "shard-00001.parquet",
    ]
    fresh = CISReranker(model=str(tiny_gpt2_dir), template="qa", estimator="forward")
    for q in source.queries:
        got = [r for r in table if r["qid"] == q.qid]
        assert [r["docid"] for r in got] == q.docids
        assert [r["rank"] for r in got] == [1, 2, 3, 4]
        cond = fresh.log_conditional(q.query, q.passages)
        prior = fresh.log_prior(q.passages)
        for r, c, p in zip(got, cond, prior, strict=True):
            assert r["log_conditional"] == pytest.approx(c, abs=1e-5)
            assert r["log_prior"] == pytest.approx(p, abs=1e-5)
            assert r["score"] == pytest.approx(c - p, abs=1e-5)


class Counting:
    """Wraps a teacher; counts scored queries and can fail after `fail_after` of them."""

    def __init__(self, inner, fail_after: int | None = None) -> None:
        self.inner, self.fail_after, self.calls = inner, fail_after, 0
        self.name = inner.name

    def describe(self):
        return self.inner.describe()

    @property
    def passage_major(self) -> bool:
        return self.inner.passage_major

    def score(self, qid, query, docids, passages) -> TeacherScores:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        return self.inner.score(qid, query, docids, passages)

    def score_many(self, items) -> list[TeacherScores]:
        return [self.score(q.qid, q.query, q.docids, q.passages) for q in items]


def test_interrupted_generate_resumes_with_only_the_missing_shards(source, cis_teacher, tmp_path):
    out = tmp_path / "rows"
    with pytest.raises(KeyboardInterrupt):
        generate(source, Counting(cis_teacher, 3), out, shard_pairs=8, progress=False)
    assert not (out / R.MANIFEST).exists() and (out / R.STATE).exists()
    assert [p.name for p in sorted(out.glob(R.SHARD_GLOB))] == ["shard-00000.parquet"]
    with pytest.raises(DataError, match="did not finish"):
        R.read_rows(out)

    again = Counting(cis_teacher)
    res = generate(source, again, out, shard_pairs=8, progress=False)
    assert again.calls == 2 and (res.shards_written, res.shards_reused) == (1, 1)
    whole = generate(source, cis_teacher, tmp_path / "whole", shard_pairs=8, progress=False)
    assert R.read_rows(out).equals(R.read_rows(whole.out))
    # Complete: a third run scores nothing.
    third = Counting(cis_teacher)
    assert generate(source, third, out, shard_pairs=8, progress=False).shards_written == 0
    assert third.calls == 0


def test_a_damaged_shard_is_rewritten(source, cis_teacher, tmp_path):
    out = tmp_path / "rows"
    with pytest.raises(KeyboardInterrupt):
        generate(source, Counting(cis_teacher, 2), out, shard_pairs=8, progress=False)
    (out / "shard-00000.parquet").write_bytes(b"not parquet")
    again = Counting(cis_teacher)
    generate(source, again, out, shard_pairs=8, progress=False)
    assert again.calls == 4 and R.read_rows(out).num_rows == 16


def test_another_teacher_never_mixes_into_a_folder(source, cis_teacher, tmp_path, tiny_gpt2_dir):
    out = tmp_path / "rows"
    generate(source, cis_teacher, out, progress=False)
    plain = load_teacher("cis", str(tiny_gpt2_dir), template="plain", estimator="forward")
    with pytest.raises(DataError, match="another source or teacher"):
        generate(source, plain, out, progress=False)
    res = generate(source, plain, out, overwrite=True, progress=False)
    assert res.manifest["identity"]["teacher"]["template"] == "plain"
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="holds no distill output"):
        generate(source, plain, stranger, progress=False)
    assert (stranger / "notes.txt").read_text() == "mine"


def test_scores_file_teacher_reads_a_trec_run(source, tmp_path):
    run = tmp_path / "teacher.trec"
    lines = [
        f"{q.qid} Q0 {d} {r} {0.5 * r - len(q.qid)} t"
        for q in source.queries
        for r, d in enumerate(q.docids, 1)
    ]
    run.write_text("\n".join(lines) + "\n")
    teacher = load_teacher("scores", scores_file=run)
    generate(source, teacher, tmp_path / "rows", progress=False)
    rows = R.read_rows(tmp_path / "rows").to_pylist()
    assert [r["score"] for r in rows] == [0.5 * r["rank"] - 3 for r in rows]
    assert all(r["log_prior"] is None for r in rows)

    run.write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(DataError, match="lacks scores for 1 passage"):
        generate(source, load_teacher("scores", scores_file=run), tmp_path / "r2", progress=False)
    with pytest.raises(DataError, match="needs --scores-file"):
        load_teacher("scores")


def test_triples_group_by_query_with_content_ids(tmp_path):
    path = tmp_path / "triples.tsv"
    path.write_text("q one\tpos a\tneg b\nq two\tpos c\tneg b\nq one\tpos a\tneg d\n")
    src = from_triples(path)
    assert [q.query for q in src.queries] == ["q one", "q two"]
    assert src.queries[0].passages == ["pos a", "neg b", "neg d"]
    assert src.queries[0].docids[1] == src.queries[1].docids[1]  # same text, same id
    path.write_text("only two\tfields\n")
    with pytest.raises(DataError, match=r"triples.tsv:1: expected"):
        from_triples(path)


def test_a_hostile_triples_file_is_one_line_naming_its_line(tmp_path, monkeypatch):
    """`--triples` (distill generate's source and distill pool's) was read with no line size cap,
    and a byte that is not UTF-8 was a UnicodeDecodeError traceback. Both readers refuse either in
    one line (a cap of 64 characters here)."""
    from cisrank.data import datasets
    from cisrank.distill.trainset import read_triples

    latin = tmp_path / "latin.tsv"
    latin.write_bytes(b"q one\tpos a\tneg b\nq caf\xe9\tpos\tneg\n")
    long = tmp_path / "long.tsv"
    long.write_text("q one\tpos a\tneg b\nq two\tpos " + "c" * 80 + "\tneg\n")
    monkeypatch.setattr(datasets, "MAX_JSON_LINE_BYTES", 64)
    for read in (from_triples, read_triples):
        with pytest.raises(DataError) as raised:
            read(latin)
        assert str(raised.value) == (
            f"{latin}:2: not a UTF-8 triples file (byte 0xe9 at column 6): give a UTF-8 text "
            "file (is it binary, or in another encoding?)"
        )
        with pytest.raises(DataError) as raised:
            read(long)
        assert str(raised.value) == (
            f"{long}:2: a line over 64 characters, the limit of a line of a triples file"
        )


def test_exactly_one_source_is_required(data_sets: Path):
    with pytest.raises(DataError, match="exactly one"):
        load_source()
    with pytest.raises(DataError, match="exactly one"):
        load_source(dataset="trec-dl22", triples="x.tsv")


def test_a_reverse_cis_teacher_cuts_shards_by_passage_and_scores_as_alone(
    source, tiny_gpt2_dir, tmp_path
):
    """The reverse estimator shares a passage's context across its queries, so its shards hold
    every pair of a run of passages; the rows are the same pairs with the scores a fresh
    reranker gives each query alone, and an interrupted run resumes shard by shard."""
    teacher = load_teacher("cis", str(tiny_gpt2_dir), estimator="reverse")
    assert teacher.passage_major
    out = tmp_path / "rows"
    with pytest.raises(KeyboardInterrupt):
        generate(source, Counting(teacher, 3), out, shard_pairs=6, progress=False)
    res = generate(source, teacher, out, shard_pairs=6, progress=False)
    assert res.manifest["identity"]["shards_by"] == "passage" and res.shards_reused >= 1
    table = R.read_rows(out).to_pylist()
    pairs = {(q.qid, d) for q in source.queries for d in q.docids}
    assert len(table) == len(pairs) == source.num_pairs
    assert {(r["qid"], r["docid"]) for r in table} == pairs
    shard_of: dict[str, set[int]] = {}
    for i, shard in enumerate(sorted(out.glob(R.SHARD_GLOB))):
        for docid in pq.read_table(shard).column("docid").to_pylist():
            shard_of.setdefault(docid, set()).add(i)
    assert all(len(s) == 1 for s in shard_of.values())  # a passage never spans two shards
    assert any(sum(r["docid"] == d for r in table) > 1 for d in shard_of)  # shared passages
    fresh = CISReranker(model=str(tiny_gpt2_dir), estimator="reverse")
    for q in source.queries:
        alone = dict(zip(q.docids, fresh.score(q.query, q.passages), strict=True))
        got = {r["docid"]: r for r in table if r["qid"] == q.qid}
        for d, expected in alone.items():
            assert got[d]["score"] == pytest.approx(expected, abs=1e-4)
            assert got[d]["rank"] == q.ranks[q.docids.index(d)]


def test_shards_by_passage_hold_every_pair_once_in_a_fixed_plan(source):
    from cisrank.distill.generate import shard_plan

    plan = shard_plan(source, 5, "passage")
    assert plan == shard_plan(source, 5, "passage")
    seen = [(q.qid, d) for shard in plan for q in shard for d in q.docids]
    assert sorted(seen) == sorted((q.qid, d) for q in source.queries for d in q.docids)
    order = [q.qid for q in source.queries]
    for shard in plan:  # queries in source order inside a shard, each once
        ids = [q.qid for q in shard]
        assert ids == sorted(set(ids), key=order.index)
    with pytest.raises(ValueError, match="query' or 'passage"):
        shard_plan(source, 5, "docid")


def test_a_cis_teacher_on_auto_records_the_runtime_that_scored(
    source, tiny_gpt2_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("CISRANK_LM_BACKEND", "torch")  # what `auto` means in this process
    teacher = load_teacher("cis", str(tiny_gpt2_dir), template="qa", backend="auto")
    assert teacher.describe()["backend"] == "torch"
    res = generate(source, teacher, tmp_path / "rows", shard_pairs=12, progress=False)
    recorded = res.manifest["identity"]["teacher"]
    assert recorded["backend"] == "torch" and recorded["fingerprint"]


def test_a_teacher_that_combines_its_query_is_never_cut_by_passage(monkeypatch, tiny_bert_dir):
    """Passage shards hold part of a query's candidates: a teacher whose scores depend on the
    whole list (the hybrid's per-query fusion) must score whole queries, whatever else it says."""
    from cisrank.rerank.hybrid import HybridReranker

    monkeypatch.setattr(HybridReranker, "passage_major", True)  # as a reverse-CIS hybrid may
    teacher = load_teacher("hybrid", str(tiny_bert_dir), fuse="dense:1,first-stage:1")
    assert teacher.reranker.passage_major and not teacher.passage_major
    assert load_teacher("dense", str(tiny_bert_dir)).passage_major


def test_a_qrels_teacher_scores_each_pair_by_its_grade(source, tmp_path):
    first, second = source.queries[:2]
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(f"{first.qid} 0 {first.docids[1]} 1\n{second.qid} 0 {second.docids[0]} 3\n")
    generate(source, load_teacher("qrels", scores_file=qrels), tmp_path / "rows", progress=False)
    table = R.read_rows(tmp_path / "rows").to_pydict()
    got = {(q, d): s for q, d, s in zip(table["qid"], table["docid"], table["score"], strict=True)}
    want = {(q.qid, d): 0.0 for q in source.queries for d in q.docids}
    want[(first.qid, first.docids[1])], want[(second.qid, second.docids[0])] = 1.0, 3.0
    assert got == want
    with pytest.raises(DataError, match="teacher 'qrels' needs --scores-file QRELS"):
        load_teacher("qrels")
    with pytest.raises(DataError, match="reads its grades from a file; drop: model"):
        load_teacher("qrels", "some-model", scores_file=qrels)


def test_a_damaged_state_file_cisrank_wrote_is_one_line_not_a_traceback(tmp_path):
    """For files cisrank writes and reads back without a checksum: a `state.json` (distill
    generate's) or an eval rag cache file of 100,000 nested brackets was a RecursionError traceback.
    Each is the reader's own one-line error now."""
    from cisrank.eval.rag.cache import _read

    state = tmp_path / R.STATE
    state.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError) as raised:
        R.read_json(state)
    assert str(raised.value) == (
        f"{state} is unreadable (JSON nested too deep: at most 64 levels of arrays and objects); "
        "delete the folder or pass --overwrite"
    )
    with pytest.raises(DataError) as raised:
        _read(state)
    assert str(raised.value) == (
        f"{state}: a damaged cache file (JSON nested too deep: at most 64 levels of arrays and "
        "objects): delete it and rerun with --resume"
    )
