"""bench/rag_nq.py on a tiny model and a made-up NQ file: contexts, figures and the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import NQ_ROWS, write_nq


@pytest.fixture(scope="module")
def rag_nq(bench_script):
    return bench_script("rag_nq")


@pytest.fixture
def nq_file(tmp_path) -> Path:
    return write_nq(tmp_path / "nq.jsonl.gz", [(q, a, [ctx], 0) for q, a, ctx in NQ_ROWS])


def test_answers_are_normalized_as_the_papers(rag_nq):
    assert rag_nq.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert rag_nq.has_answer("It was William SHAKESPEARE, of course.", ["Shakespeare"])
    assert rag_nq.has_answer("an answer: the year 1564", ["1564"])
    assert not rag_nq.has_answer("Marlowe", ["Shakespeare", "the"])  # "the" normalizes to ""


def test_contexts_hold_the_gold_once_and_no_answer_elsewhere(rag_nq, nq_file):
    qs = rag_nq.load_questions(nq_file)
    pool = rag_nq.Pool(qs)
    for q in qs:
        for kind in ("random", "related"):
            docs, scores, gold = rag_nq.build_context(pool, q, 4, kind, seed=0)
            assert docs[gold] == q.gold and len({d.text for d in docs}) == 4
            assert not any(
                rag_nq.has_answer(d.contents, q.answers) for i, d in enumerate(docs) if i != gold
            )
            assert scores == sorted(scores, reverse=True)  # BM25 order
            assert (docs, scores, gold) == rag_nq.build_context(pool, q, 4, kind, seed=0)
        # related = the BM25 top 3 of the eligible passages
        related = rag_nq.build_context(pool, q, 4, "related", seed=0)[0]
        ok = pool.eligible(q)
        all_scores = pool.bm25.scores(q.question)
        top = sorted(ok, key=lambda i: (-float(all_scores[i]), i))[:3]
        assert {d.text for d in related} - {q.gold.text} == {pool.passages[i].text for i in top}


def test_smoke_run_writes_its_figures(rag_nq, nq_file, tiny_gpt2_dir, tmp_path):
    payload = rag_nq.main(
        [
            "--data", str(nq_file), "--questions", "2", "--k", "3", "--model", str(tiny_gpt2_dir),
            "--max-new-tokens", "2", "--noise", "1", "--results-dir", str(tmp_path),
            "--name", "rag_nq_smoke",
        ]
    )  # fmt: skip
    record = json.loads((tmp_path / "rag_nq_smoke.json").read_text())
    assert record["results"]["results"] == payload["results"] and record["results"]["complete"]
    assert set(payload["results"]) == {"random_k3", "related_k3"}
    for key, res in payload["results"].items():
        assert res["questions"] == 2 and res["chance_gold_first"] == pytest.approx(1 / 3)
        assert set(res["accuracy"]) == set(rag_nq.MODES)
        assert all(0 <= v <= 1 for v in res["accuracy"].values())
        # (a) is the mean over questions of the rotation scores, by gold position
        recs = payload["per_question"][key]
        want = [0.0] * 3
        for rec in recs:
            for r, lr in enumerate(rec["rotation_loglik"]):
                want[(rec["gold_input_position"] - r) % 3] += lr / 2
        assert res["loglik_by_gold_position"] == pytest.approx(want)
        # (b) curvature's first passage is the gold where the record says so
        firsts = [rec["curvature_order"][0] == rec["gold_input_position"] for rec in recs]
        assert res["curvature_gold_first"] == sum(firsts) / 2
        assert all(set(rec["answers"]) == set(rag_nq.MODES) for rec in recs)


def test_a_later_run_reuses_the_scores_and_merges_with_the_first(
    rag_nq, nq_file, tiny_gpt2_dir, tmp_path
):
    """Split a run as the real one is split: rotation scores and two baselines first, then the
    other modes reading those scores (checked by re-scoring one question), then --merge."""
    common = [
        "--data", str(nq_file), "--questions", "3", "--k", "3", "--model", str(tiny_gpt2_dir),
        "--max-new-tokens", "2", "--noise", "1", "--results-dir", str(tmp_path),
        "--distractors", "random",
    ]  # fmt: skip
    first = rag_nq.main([*common, "--modes", "positions,closed_book", "--name", "first"])
    later_modes = "ranked,curvature,pmi_rotation,avg_ens,leens"
    later = rag_nq.main(
        [
            *common,
            "--modes",
            later_modes,
            "--reuse",
            str(tmp_path / "first.json"),
            "--name",
            "later",
        ]
    )
    a, b = first["per_question"]["random_k3"], later["per_question"]["random_k3"]
    for x, y in zip(a, b, strict=True):
        assert y["reused_scores"] and y["rotation_loglik"] == x["rotation_loglik"]
        assert y["curvature_order"] == x["curvature_order"]
        assert set(y["answers"]) == set(later_modes.split(","))
    # the same answers as a run that scores for itself
    fresh = rag_nq.main([*common, "--modes", later_modes, "--name", "fresh"])
    for x, y in zip(fresh["per_question"]["random_k3"], b, strict=True):
        assert x["answers"] == y["answers"]
        assert x["rotation_loglik"] == pytest.approx(y["rotation_loglik"], abs=1e-4)
    merged = rag_nq.main(
        ["--merge", str(tmp_path / "first.json"), str(tmp_path / "later.json"),
         "--results-dir", str(tmp_path), "--name", "merged"]
    )["results"]["random_k3"]  # fmt: skip
    assert merged["questions"] == merged["questions_scored"] == 3
    assert (
        merged["loglik_by_gold_position"]
        == first["results"]["random_k3"]["loglik_by_gold_position"]
    )
    assert set(merged["accuracy"]) == {"closed_book", *later_modes.split(",")}
    for mode, acc in later["results"]["random_k3"]["accuracy"].items():
        assert merged["accuracy"][mode] == acc
    assert (
        merged["accuracy"]["closed_book"]
        == first["results"]["random_k3"]["accuracy"]["closed_book"]
    )
    assert "scoring" in merged["seconds_per_question"]  # from the run that scored
    # a reused file whose scores are not what this model computes is refused
    tampered = json.loads((tmp_path / "first.json").read_text())
    for rec in tampered["results"]["per_question"]["random_k3"]:
        rec["rotation_loglik"] = [v + 0.01 for v in rec["rotation_loglik"]]
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    with pytest.raises(SystemExit, match="reused scores differ"):
        rag_nq.main([*common, "--modes", "ranked", "--reuse", str(tmp_path / "tampered.json")])


def test_resume_runs_only_the_missing_questions_and_equals_one_run(
    rag_nq, nq_file, tiny_gpt2_dir, tmp_path, monkeypatch
):
    common = [
        "--data", str(nq_file), "--k", "3", "--model", str(tiny_gpt2_dir), "--max-new-tokens", "2",
        "--noise", "1", "--results-dir", str(tmp_path), "--distractors", "random",
        "--modes", "positions,ranked,reverse,avg_ens",
    ]  # fmt: skip
    whole = rag_nq.main([*common, "--questions", "3", "--name", "whole"])
    rag_nq.main([*common, "--questions", "2", "--name", "part"])  # as if killed after two
    calls = []
    real = rag_nq.run_question
    monkeypatch.setattr(
        rag_nq, "run_question", lambda *a, **kw: calls.append(a[3].index) or real(*a, **kw)
    )
    resumed = rag_nq.main([*common, "--questions", "3", "--name", "part", "--resume"])
    assert calls == [2]  # only the question the first run had not reached
    assert resumed["complete"]
    a, b = whole["per_question"]["random_k3"], resumed["per_question"]["random_k3"]
    assert [r["question"] for r in b] == [0, 1, 2]
    for x, y in zip(a, b, strict=True):
        assert x["answers"] == y["answers"]
        assert x["rotation_loglik"] == pytest.approx(y["rotation_loglik"], abs=1e-5)
    fig_a, fig_b = whole["results"]["random_k3"], resumed["results"]["random_k3"]
    assert fig_a["accuracy"] == fig_b["accuracy"] and fig_b["questions"] == 3
    assert fig_a["loglik_by_gold_position"] == pytest.approx(fig_b["loglik_by_gold_position"])
    # a finished result resumed again runs nothing; other settings are refused
    calls.clear()
    rag_nq.main([*common, "--questions", "3", "--name", "part", "--resume"])
    assert calls == []
    with pytest.raises(SystemExit, match=r"other settings.*seed"):
        rag_nq.main([*common, "--questions", "3", "--name", "part", "--resume", "--seed", "1"])


def test_workers_split_the_questions_and_merge_to_one_run(rag_nq, nq_file, tiny_gpt2_dir, tmp_path):
    common = [
        "--data", str(nq_file), "--k", "3", "--model", str(tiny_gpt2_dir), "--max-new-tokens", "2",
        "--noise", "1", "--results-dir", str(tmp_path), "--distractors", "random",
        "--modes", "positions,ranked,avg_ens", "--questions", "3",
    ]  # fmt: skip
    whole = rag_nq.main([*common, "--name", "whole"])
    split = rag_nq.main([*common, "--name", "split", "--workers", "2"])
    assert sorted(p.name for p in tmp_path.glob("split*.json")) == [
        "split.json",
        "split_part0.json",
        "split_part1.json",
    ]
    a, b = whole["per_question"]["random_k3"], split["per_question"]["random_k3"]
    assert [r["question"] for r in b] == [0, 1, 2] and split["complete"]
    for x, y in zip(a, b, strict=True):
        assert x["answers"] == y["answers"]
        assert x["rotation_loglik"] == pytest.approx(y["rotation_loglik"], abs=1e-5)
    assert whole["results"]["random_k3"]["accuracy"] == split["results"]["random_k3"]["accuracy"]
