"""bench/rag_nq_report.py: its tests against scipy, its position bookkeeping against a hand count."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from cisrank.context.assemble import curvature_scores, sort_desc


@pytest.fixture(scope="module")
def report(bench_script):
    return bench_script("rag_nq_report")


@pytest.mark.parametrize(("b", "c"), [(43, 12), (3, 5), (22, 4), (0, 7), (10, 10), (1, 0)])
def test_mcnemar_is_the_exact_binomial_test(report, b, c):
    assert report.mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue)


@pytest.mark.parametrize(
    ("x", "n", "p"), [(41, 200, 0.1), (3, 10, 0.2), (0, 5, 0.5), (20, 20, 0.05)]
)
def test_binomial_tail_matches_scipy(report, x, n, p):
    assert report.binomial_sf(x, n, p) == pytest.approx(stats.binom.sf(x - 1, n, p), rel=1e-9)


def _rec(q, gold, loglik, order, answers):
    return {
        "question": q,
        "gold_input_position": gold,
        "rotation_loglik": loglik,
        "curvature_order": order,
        "answers": {m: {"text": "", "correct": ok} for m, ok in answers.items()},
    }


def test_rotation_r_puts_the_gold_at_g_minus_r(report):
    # K = 4, gold at input position 1: rotation 0 -> position 1, rotation 1 -> 0,
    # rotation 2 -> 3 (last), rotation 3 -> 2
    rec = _rec(0, 1, [-1.0, -2.0, -3.0, -4.0], [1, 0, 2, 3], {})
    assert report.gold_position_loglik(rec, 4).tolist() == [-2.0, -1.0, -4.0, -3.0]
    orders = report.order_stats([rec], 4)
    # the best rotation (0) leaves the gold at position 1: neither first nor last
    assert (orders["curvature_first"], orders["pmi_rotation_gold_first"]) == (1, 0)
    assert orders["pmi_rotation_gold_last"] == 0
    assert orders["curvature_successor_first"] == 0


def test_curvature_credits_the_gold_last_rotation_to_the_successor(report):
    # K = 4, gold at 0, recency-dominated: rot_1 (gold last) is best, rot_2 (gold third) next.
    # Scores l(rot_j) + l(rot_{j+1}): d0 = -4 + -1, d1 = -1 + -2, d2 = -2 + -3, d3 = -3 + -4,
    # so d1 (the gold's successor) comes first
    loglik = [-4.0, -1.0, -2.0, -3.0]
    order = sort_desc(curvature_scores(loglik))
    assert order[0] == 1
    orders = report.order_stats([_rec(0, 0, loglik, order, {})], 4)
    assert (orders["curvature_first"], orders["curvature_successor_first"]) == (0, 1)
    assert orders["pmi_rotation_gold_last"] == 1


def test_position_means_and_paired_contrast(report):
    recs = [
        _rec(0, 0, [-1.0, -3.0, -2.0], [0, 1, 2], {}),  # positions: 0 -> -1, 2 -> -3, 1 -> -2
        _rec(1, 2, [-1.0, -2.0, -4.0], [2, 0, 1], {}),  # positions: 2 -> -1, 1 -> -2, 0 -> -4
    ]
    pos = report.position_stats(recs, 3)
    assert pos["mean"] == pytest.approx([-2.5, -2.0, -2.0])
    assert pos["se"][0] == pytest.approx(1.5)  # sd of (-1, -4) / sqrt(2)
    assert pos["lowest_middle_position"] == 1
    assert pos["first_minus_lowest"] == pytest.approx(-0.5)  # (-1 - -2 + -4 - -2) / 2
    assert pos["last_above_middle"] == pytest.approx(0.5)  # -3 < -2; -1 > -2


def test_accuracy_pairs_only_questions_that_ran_both(report):
    recs = [
        _rec(0, 0, [0.0], [0], {"ranked": False, "reverse": True}),
        _rec(1, 0, [0.0], [0], {"ranked": False, "reverse": True}),
        _rec(2, 0, [0.0], [0], {"ranked": True, "reverse": False}),
        _rec(3, 0, [0.0], [0], {"ranked": True}),
    ]
    acc = report.accuracy_stats(recs)
    assert acc["ranked"] == {"questions": 4, "accuracy": 0.5}
    assert (acc["reverse"]["questions"], acc["reverse"]["accuracy"]) == (3, pytest.approx(2 / 3))
    assert (acc["reverse"]["wins"], acc["reverse"]["losses"]) == (2, 1)
    assert acc["reverse"]["p"] == pytest.approx(1.0)


def test_baselines_come_from_the_same_question(report, tmp_path, capsys):
    related = [_rec(5, 0, [-1.0, -2.0], [0, 1], {"ranked": True})]
    random_ = [
        _rec(4, 0, [-1.0, -2.0], [0, 1], {"closed_book": True}),
        _rec(5, 0, [-1.0, -2.0], [0, 1], {"closed_book": False, "gold_only": True}),
    ]
    for name, recs in (("related", related), ("random", random_)):
        body = {"results": {"per_question": {f"{name}_k2": recs}}}
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    out = report.main(
        [str(tmp_path / "related.json"), "--baselines", str(tmp_path / "random.json")]
    )
    acc = out["related_k2"]["accuracy"]
    assert acc["closed_book"]["accuracy"] == 0.0 and acc["gold_only"]["accuracy"] == 1.0
    assert "| ranked | 1 | 1.000 |" in capsys.readouterr().out


def test_against_pairs_the_same_mode_by_question_number(report, tmp_path, capsys):
    # K = 20 holds questions 7, 8, 9; K = 10 holds 8, 9, 10 (in another order): only 8 and 9
    # pair, and `there` is K = 10's accuracy on exactly those two
    k20 = [
        _rec(7, 0, [0.0], [0], {"reverse": True, "closed_book": True}),
        _rec(8, 0, [0.0], [0], {"reverse": True, "ranked": False}),
        _rec(9, 0, [0.0], [0], {"reverse": False, "ranked": False}),
    ]
    k10 = [
        _rec(10, 0, [0.0], [0], {"reverse": True}),
        _rec(9, 0, [0.0], [0], {"reverse": True, "ranked": True}),
        _rec(8, 0, [0.0], [0], {"reverse": False, "ranked": False, "closed_book": True}),
    ]
    rows = report.against_stats(k20, k10)
    assert set(rows) == {"ranked", "reverse"}  # closed_book is a baseline: not compared
    assert rows["reverse"] == {
        "questions": 2,
        "accuracy_here": 0.5,
        "accuracy_there": 0.5,
        "wins": 1,  # question 8: right at K = 20, wrong at K = 10
        "losses": 1,  # question 9: the reverse
        "p": pytest.approx(stats.binomtest(1, 2, 0.5).pvalue),
    }
    assert (rows["ranked"]["accuracy_there"], rows["ranked"]["losses"]) == (0.5, 1)
    for name, recs in (("k20", k20), ("k10", k10)):
        body = {"results": {"per_question": {f"random_{name}": recs}}}
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    report.main([str(tmp_path / "k20.json"), "--against", str(tmp_path / "k10.json")])
    assert "| reverse | 2 | 0.500 | 0.500 | 1 : 1 | 1 |" in capsys.readouterr().out
