"""The evaluator against nDCG, AP and recall computed by hand (trec_eval definitions)."""

import itertools
import math

import pytest

from cisrank.data.runs import Run
from cisrank.errors import DataError
from cisrank.eval.metrics import evaluate, paired_test, per_query

QRELS = {
    "q1": {"d1": 3, "d2": 2, "d3": 0, "d4": 1},
    "q2": {"d5": 1},
    "q3": {"d9": 2},  # judged, missing from the run: counts 0
}


def dcg(grades):
    return sum(g / math.log2(i + 2) for i, g in enumerate(grades))


def run():
    # d3 and d2 tie: input order (d3 first) must decide, whatever the docids sort to.
    return Run.from_scores(
        "t",
        {
            "q1": [("d3", 0.9), ("d2", 0.9), ("d1", 0.5), ("d4", 0.1), ("dx", 0.05)],
            "q2": [("dz", 2.0), ("d5", 1.0)],
            "q_unjudged": [("d1", 1.0)],
        },
    )


def test_ndcg_matches_hand_computation_with_ties_and_missing_query():
    q1 = dcg([0, 2, 3, 1, 0]) / dcg([3, 2, 1, 0])
    q2 = dcg([0, 1]) / dcg([1])
    values = per_query(run(), QRELS, ["nDCG@5", "nDCG@1"])
    assert values["nDCG@5"]["q1"] == pytest.approx(q1, abs=1e-9)
    assert values["nDCG@5"]["q2"] == pytest.approx(q2, abs=1e-9)
    assert values["nDCG@5"]["q3"] == 0.0
    assert "q_unjudged" not in values["nDCG@5"]
    means = evaluate(run(), QRELS, ["nDCG@5", "nDCG@1"])
    assert means["nDCG@5"] == pytest.approx((q1 + q2 + 0.0) / 3, abs=1e-9)
    assert means["nDCG@1"] == 0.0  # d3 (grade 0) and dz (unjudged) rank first


def test_binary_measures_use_grade_two_and_above():
    values = per_query(
        run(), QRELS, ["AP(rel=2)", "R(rel=2)@100", "R(rel=2)@2", "RR(rel=2)@10", "RR(rel=2)@1"]
    )
    # q1 relevant: d1, d2 at ranks 3 and 2 -> AP = (1/2 + 2/3) / 2
    assert values["AP(rel=2)"]["q1"] == pytest.approx((1 / 2 + 2 / 3) / 2, abs=1e-9)
    assert values["R(rel=2)@100"]["q1"] == 1.0
    assert values["R(rel=2)@2"]["q1"] == 0.5
    assert values["R(rel=2)@100"]["q3"] == 0.0
    assert values["RR(rel=2)@10"]["q1"] == 0.5  # first grade >= 2 at rank 2
    assert values["RR(rel=2)@1"]["q1"] == 0.0


def test_ties_broken_by_input_order_and_made_strict():
    r = Run.from_scores("t", {"q": [("a", 1.0), ("c", 2.0), ("b", 2.0), ("d", 2.0)]})
    ranking = r.rankings["q"]
    assert [d for d, _ in ranking] == ["c", "b", "d", "a"]
    scores = [s for _, s in ranking]
    assert all(x > y for x, y in itertools.pairwise(scores))
    assert scores[0] == 2.0 and 2.0 - 1e-6 < scores[1] < 2.0


def test_tie_order_survives_a_trec_file_round_trip(tmp_path):
    # trec_eval would put docid "b" before "a" on a raw tie (it sorts ties by docid);
    # the nudged scores keep the run's own order through the file and the evaluator.
    r = Run.from_scores("t", {"q": [("a", 1.0), ("b", 1.0)]})
    path = r.write_trec(tmp_path / "run.trec")
    back = Run.read_trec(path)
    assert back.rankings == r.rankings
    qrels = {"q": {"a": 1, "b": 0}}
    assert evaluate(back, qrels, ["nDCG@1"])["nDCG@1"] == 1.0
    lines = path.read_text().splitlines()
    assert lines[0].split()[:4] == ["q", "Q0", "a", "1"]


def test_duplicate_docids_are_rejected(tmp_path):
    with pytest.raises(DataError, match="duplicate docid 'a'"):
        Run.from_scores("t", {"q": [("a", 1.0), ("a", 0.5)]})
    bad = tmp_path / "dup.trec"
    bad.write_text("q Q0 a 1 2.0 t\nq Q0 a 2 1.0 t\n")
    with pytest.raises(DataError, match=r"dup.trec:2: duplicate docid 'a'"):
        Run.read_trec(bad)


def test_scores_equal_in_single_precision_are_separated():
    # 1.0 and 1.0 - 1e-9 differ in float64 but tie in trec_eval's float32: keep input order.
    r = Run.from_scores("t", {"q": [("b", 1.0 - 1e-9), ("a", 1.0)]})
    assert [d for d, _ in r.rankings["q"]] == ["a", "b"]
    assert evaluate(r, {"q": {"a": 1, "b": 0}}, ["nDCG@1"])["nDCG@1"] == 1.0


def test_non_finite_scores_are_rejected():
    with pytest.raises(DataError, match="not finite"):
        Run.from_scores("t", {"q": [("a", float("nan"))]})


def test_paired_test_on_known_differences():
    base = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}
    sys_ = {"a": 0.2, "b": 0.4, "c": 0.3, "d": 0.5}
    out = paired_test(base, sys_, permutations=20_000)
    assert out["wins"] == 3 and out["ties"] == 1 and out["losses"] == 0
    assert out["mean_delta"] == pytest.approx(0.1)
    # t = mean(d) / (sd(d) / sqrt(n)) with d = [.1, .2, 0, .1]
    d = [0.1, 0.2, 0.0, 0.1]
    m = sum(d) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / 3)
    assert out["t_statistic"] == pytest.approx(m / (sd / 2), rel=1e-9)
    # Exact randomization p: of the 16 sign flips, |mean| >= 0.1 needs the three non-zero
    # differences to share a sign: 2 of 8, whatever the zero's sign -> 1/4.
    assert out["p_randomization"] == pytest.approx(1 / 4, abs=0.015)
    assert paired_test(base, base)["p_ttest"] == 1.0


def test_written_files_get_normal_permissions(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        path = Run.from_scores("t", {"q": [("a", 1.0)]}).write_trec(tmp_path / "r.trec")
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644
