"""`eval` refuses what it cannot evaluate honestly: judged queries without a topic or candidates are
named and refused unless `missing` says to count them 0 or leave them out; qrels sharing no query
with the topics and candidates are refused whatever it says; a passage judged twice with two grades
is refused naming both lines. On real DL19 files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cisrank.data.datasets import load_local, read_qrels, read_topics
from cisrank.errors import DataError
from cisrank.eval.metrics import per_query
from cisrank.eval.pipeline import FIRST_STAGE, first_stage_run, run_eval
from cisrank.rerank.base import IdentityReranker

BM25_DL19_NDCG10 = 0.5058  # ../shared/data/README.md


@pytest.fixture(scope="module")
def dl19(data_root: Path) -> dict[str, Path]:
    folder = data_root / "trec-dl19"
    return {
        "topics": folder / "topics.tsv",
        "qrels": folder / "qrels.txt",
        "candidates": folder / "candidates-bm25-top100.json",
    }


@pytest.fixture(scope="module")
def five_topics(dl19, tmp_path_factory) -> Path:
    """The first 5 of DL19's 43 topics, as the probe cut them."""
    lines = dl19["topics"].read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path_factory.mktemp("cut") / "topics.tsv"
    path.write_text("".join(lines[:5]), encoding="utf-8")
    return path


def _ndcg10(dataset, missing: str) -> float:
    return run_eval(dataset, IdentityReranker(), progress=False, missing=missing).metrics[
        FIRST_STAGE
    ]["nDCG@10"]


def test_the_whole_dl19_still_evaluates_to_its_reference_figure(dl19):
    dataset = load_local("trec-dl19", **dl19)
    result = run_eval(dataset, IdentityReranker(), progress=False)
    assert round(result.metrics[FIRST_STAGE]["nDCG@10"], 4) == BM25_DL19_NDCG10
    assert result.info["queries_judged"] == result.info["queries_evaluated"] == 43
    assert "judged_not_run" not in result.info


def test_topics_cut_to_5_of_43_are_refused_naming_the_38_then_evaluated_as_asked(dl19, five_topics):
    """Before: "5 queries", nDCG@10 0.0533, exit 0 (the 38 unrun judged queries silently 0).
    Reference: per-query nDCG@10 of the complete evaluation, by hand over the 5 queries."""
    dataset = load_local("cut", **{**dl19, "topics": five_topics})
    kept = list(read_topics(five_topics))
    all_judged = list(read_qrels(dl19["qrels"]))
    not_run = [q for q in all_judged if q not in kept]
    with pytest.raises(DataError) as caught:
        run_eval(dataset, IdentityReranker(), progress=False)
    message = str(caught.value)
    assert message.startswith(
        f"dataset 'cut': 38 of its 43 judged queries cannot be run: 38 have no topic "
        f"({', '.join(not_run[:5])} and 33 more): give the topics and candidates of the whole "
        "query set, or pass --missing zero"
    )
    assert message.endswith("--missing skip (evaluate the 5 that can be run)")
    assert "\n" not in message

    full = load_local("trec-dl19", **dl19)
    values = per_query(first_stage_run(full), full.qrels, ["nDCG@10"])["nDCG@10"]
    assert round(_ndcg10(dataset, "zero"), 4) == round(sum(values[q] for q in kept) / 43, 4)
    assert round(_ndcg10(dataset, "zero"), 4) == 0.0533  # the probe's figure, now asked for
    assert _ndcg10(dataset, "skip") == pytest.approx(sum(values[q] for q in kept) / 5, abs=1e-12)
    result = run_eval(dataset, IdentityReranker(), progress=False, missing="skip")
    assert result.info["queries_evaluated"] == 5
    assert result.info["judged_not_run"]["no_topic"] == not_run


def test_judged_queries_without_candidates_are_named_apart(dl19, tmp_path):
    hits = json.loads(dl19["candidates"].read_text(encoding="utf-8"))
    cut = {str(entry["hits"][0]["qid"]) for entry in hits[:2]}
    dropped = [q for q in read_qrels(dl19["qrels"]) if q in cut]  # named in qrels order
    path = tmp_path / "candidates.json"
    path.write_text(json.dumps(hits[2:]), encoding="utf-8")
    dataset = load_local("cut", **{**dl19, "candidates": path})
    with pytest.raises(
        DataError,
        match=rf"2 of its 43 judged queries cannot be run: 2 no "
        rf"candidates \({dropped[0]}, {dropped[1]}\)",
    ):
        run_eval(dataset, IdentityReranker(), progress=False)


@pytest.mark.parametrize("missing", ["refuse", "zero", "skip"])
def test_qrels_of_another_query_set_are_refused_whatever_is_asked(dl19, data_root, missing):
    """Before: DL21's qrels against DL19's topics and candidates gave 0.0 everywhere, exit 0."""
    dataset = load_local("mixed", **{**dl19, "qrels": data_root / "trec-dl21" / "qrels.txt"})
    with pytest.raises(DataError, match=r"no judged query can be run: the qrels judge 53 \("):
        run_eval(dataset, IdentityReranker(), progress=False, missing=missing)


def test_a_passage_graded_twice_is_refused_naming_both_lines_and_a_repeated_line_is_not(
    dl19, tmp_path
):
    """Before: the last of two conflicting lines won silently."""
    lines = dl19["qrels"].read_text(encoding="utf-8").splitlines(keepends=True)
    qid, q0, docid, grade = lines[9].split()
    conflicting = tmp_path / "conflicting.txt"
    conflicting.write_text("".join([*lines, f"{qid} {q0} {docid} {int(grade) + 1}\n"]))
    with pytest.raises(DataError) as caught:
        read_qrels(conflicting)
    assert str(caught.value) == (
        f"{conflicting}:{len(lines) + 1}: query {qid} passage {docid} graded {int(grade) + 1} "
        f"here and {grade} on line 10: keep one judgment per passage"
    )
    repeated = tmp_path / "repeated.txt"
    repeated.write_text("".join([*lines, lines[9], lines[0]]))
    assert read_qrels(repeated) == read_qrels(dl19["qrels"])


def test_a_qid_given_two_texts_in_the_topics_is_refused(tmp_path):
    path = tmp_path / "topics.tsv"
    path.write_text("1\tone\n2\ttwo\n1\tone\n1\tuno\n")
    with pytest.raises(DataError, match=r":4: query 1 is 'uno' here and 'one' on line 1"):
        read_topics(path)
