"""Hybrid reranking: fusion math against numpy references, routing of options, and the identity
between fusing saved runs (how weights are chosen) and the hybrid reranker (what is served)."""

import numpy as np
import pytest
from builders import hit, write_folder

from cisrank.data.datasets import load_folder
from cisrank.data.types import rank_order
from cisrank.errors import CisrankError
from cisrank.eval.pipeline import RERANKED, first_stage_run, run_eval
from cisrank.fusion import fuse, fuse_runs, input_order, normalize, parse_weights
from cisrank.rerank import load_reranker
from cisrank.rerank.base import BaseReranker, IdentityReranker
from cisrank.rerank.hybrid import HybridReranker


class TableReranker(BaseReranker):
    """Scores from a fixed text -> score table: a transparent component."""

    def __init__(self, name, table):
        self.name = name
        self.model_name = name
        self.table = table
        self.calls = 0

    def score_batch(self, requests):
        self.calls += 1
        return [[self.table[p] for p in passages] for _, passages in requests]


A = {"p1": -3.0, "p2": -1.0, "p3": -2.0, "p4": -10.0}  # log-likelihood-like
B = {"p1": 0.9, "p2": 0.1, "p3": 0.5, "p4": 0.5}  # cosine-like, with a tie
P = ["p1", "p2", "p3", "p4"]


def test_normalizations_match_numpy():
    x = np.array([A[p] for p in P])
    assert normalize(x.tolist(), "minmax") == pytest.approx(
        ((x - x.min()) / (x.max() - x.min())).tolist()
    )
    assert normalize(x.tolist(), "zscore") == pytest.approx(((x - x.mean()) / x.std()).tolist())
    assert normalize([2.0, 2.0], "minmax") == [0.0, 0.0]
    assert normalize([2.0, 2.0], "zscore") == [0.0, 0.0]
    with pytest.raises(ValueError, match="normalization"):
        normalize([1.0], "softmax")


def test_linear_and_rrf_fusion_by_hand():
    a, b = [A[p] for p in P], [B[p] for p in P]
    # min-max: a -> [7/9, 1, 8/9, 0]; b -> [1, 0, 0.5, 0.5]
    want = [0.3 * 7 / 9 + 0.7 * 1, 0.3 * 1, 0.3 * 8 / 9 + 0.7 * 0.5, 0.7 * 0.5]
    assert fuse([a, b], [0.3, 0.7]) == pytest.approx(want)
    # ranks: a -> [3, 1, 2, 4]; b -> [1, 4, 2, 3] (the tie of p3 and p4 by input order)
    assert rank_order(b) == [0, 2, 3, 1]  # ranks [1, 4, 2, 3]
    k = 60.0
    want = [1 / (k + 3) + 2 / (k + 1), 1 / (k + 1) + 2 / (k + 4)]
    assert fuse([a, b], [1.0, 2.0], "rrf")[:2] == pytest.approx(want)
    with pytest.raises(ValueError, match="one score per passage"):
        fuse([a, b[:3]], [1.0, 1.0])
    with pytest.raises(ValueError, match="method"):
        fuse([a], [1.0], "borda")


def test_parse_weights():
    assert parse_weights("cis:0.6, dense:0.4") == {"cis": 0.6, "dense": 0.4}
    assert parse_weights({"cis": 1}) == {"cis": 1.0}
    for bad, match in [
        ("cis", "NAME:WEIGHT"),
        ("cis:x", "not a number"),
        ("cis:1,cis:2", "twice"),
        ("cis:-1", ">= 0"),
        ("cis:nan", ">= 0"),
        ("cis:0", "above 0"),
        ("", "above 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_weights(bad)


def _hybrid(**options):
    comps = {"cis": TableReranker("cis", A), "dense": TableReranker("dense", B)}
    return HybridReranker(components=comps, **options), comps


def test_hybrid_scores_are_the_fusion_of_its_components_and_batch_independent():
    r, comps = _hybrid(fuse="cis:0.3,dense:0.7")
    reqs = [("q1", P), ("q2", ["p4", "p1"]), ("q3", [])]
    got = r.score_batch(reqs)
    assert comps["cis"].calls == 1 and comps["dense"].calls == 1  # one call per component
    assert got[0] == pytest.approx(fuse([[A[p] for p in P], [B[p] for p in P]], [0.3, 0.7]))
    assert got[2] == []
    assert r.score("q2", ["p4", "p1"]) == got[1]  # alone or batched: the same scores
    assert r.model_name == "cis(cis)+dense(dense)"


def test_first_stage_component_is_the_input_order():
    r, _ = _hybrid(fuse="dense:1,first-stage:1", fusion="rrf", rrf_k=0)
    # dense ranks [1, 4, 2, 3]; input order ranks [1, 2, 3, 4]
    assert r.score("q", P) == pytest.approx([2.0, 1 / 4 + 1 / 2, 1 / 2 + 1 / 3, 1 / 3 + 1 / 4])


@pytest.mark.parametrize(
    "options",
    [
        {"fuse": "cis:0.4,first-stage:0.1,dense:0.5"},
        {"fuse": "cis:1,first-stage:1", "fusion_normalize": "zscore"},
        {"fuse": "dense:1,first-stage:1", "fusion": "rrf", "rrf_k": 0},
    ],
)
def test_a_request_scored_in_slices_and_combined_whole_gets_the_scores_of_the_whole(options):
    """What the API's batcher and a worker pool do: parts of slices (in any grouping, here
    across two calls and beside another query), then one `combine` over the whole request."""
    r, _ = _hybrid(**options)
    assert r.combines_request
    whole = r.score_batch([("q", P)])[0]
    first = r.score_parts([("q", P[:1]), ("other", ["p2", "p4"])])[0]
    rest = r.score_parts([("q", P[1:3])])[0] + r.score_parts([("q", P[3:])])[0]
    assert r.combine("q", P, first + rest) == whole
    # fusing each slice on its own (what was served before) is another ranking: min-max over
    # one passage is 0, and the first stage restarts at every slice
    sliced = [s for a, b in ((0, 1), (1, 3), (3, 4)) for s in r.score("q", P[a:b])]
    assert sliced != pytest.approx(whole)


def test_the_identity_numbers_the_whole_request_not_a_slice():
    r = IdentityReranker()
    parts = r.score_parts([("q", ["a", "b"]), ("q", ["c"])])
    assert r.combines_request and r.combine("q", ["a", "b", "c"], parts[0] + parts[1]) == [
        3.0,
        2.0,
        1.0,
    ]
    assert r.score("q", ["a", "b", "c"]) == [3.0, 2.0, 1.0]


def test_options_reach_the_component_that_takes_them(tiny_bert_dir, tiny_gpt2_dir):
    r = load_reranker(
        "hybrid",
        str(tiny_gpt2_dir),
        fuse="cis:0.5,dense:0.5",
        models={"dense": str(tiny_bert_dir)},
        estimator="reverse",
        template=None,  # None means "default", dropped like every CLI flag left unset
    )
    cis, dense = r.components["cis"], r.components["dense"]
    assert cis.config.estimator == "reverse" and cis.model_name == str(tiny_gpt2_dir)
    assert dense.model_name == str(tiny_bert_dir)
    with pytest.raises(CisrankError, match=r"quantize.*none of the fused"):
        load_reranker("hybrid", None, fuse="first-stage:1", quantize="int8")
    with pytest.raises(CisrankError, match="no fused component takes a model"):
        load_reranker("hybrid", "m", fuse="first-stage:1")
    with pytest.raises(CisrankError, match="cannot contain itself"):
        load_reranker("hybrid", None, fuse="hybrid:1")
    with pytest.raises(CisrankError, match="unknown reranker"):
        load_reranker("hybrid", None, fuse="bm99:1")
    with pytest.raises(CisrankError, match="--fuse"):
        load_reranker("hybrid", None, fuse="dense")


def _two_queries(tmp_path):
    """A TREC DL-shaped folder: the four passages in BM25 order for q1, reversed for q2. BM25
    scores are not linear in rank, so fusing raw scores and fusing ranks differ."""
    hits = [hit(p, i, 12.0 / i, p) for i, p in enumerate(P, 1)]
    return write_folder(
        tmp_path / "mini",
        {("q1", "one"): hits, ("q2", "two"): hits[::-1]},
        qrels="q1 Q0 p2 2\nq1 Q0 p3 1\nq2 Q0 p4 2\n",
        topics="q1\tone\nq2\ttwo\n",
    )


@pytest.mark.parametrize("fusion", ["linear", "rrf"])
def test_fusing_saved_runs_equals_the_hybrid_reranker_in_eval(tmp_path, fusion):
    """Weights are chosen by fusing saved runs (bench/hybrid_select.py); the served hybrid must
    rank exactly as that fusion did, tail below the depth included."""
    folder = _two_queries(tmp_path)
    dataset = load_folder(folder)
    depth = 3
    runs = [
        run_eval(dataset, TableReranker(n, t), depth=depth, progress=False).runs[RERANKED]
        for n, t in [("cis", A), ("dense", B)]
    ]
    runs.append(input_order(first_stage_run(dataset)))
    weights = [0.5, 0.3, 0.2]
    want = fuse_runs(runs, weights, fusion, depth=depth)
    comps = {"cis": TableReranker("cis", A), "dense": TableReranker("dense", B)}
    hybrid = HybridReranker(
        components=comps, fuse="cis:0.5,dense:0.3,first-stage:0.2", fusion=fusion
    )
    got = run_eval(dataset, hybrid, depth=depth, progress=False).runs[RERANKED]
    assert got.rankings.keys() == want.rankings.keys()
    for qid in want.rankings:
        assert [d for d, _ in got.rankings[qid]] == [d for d, _ in want.rankings[qid]]
        assert [s for _, s in got.rankings[qid]] == pytest.approx(
            [s for _, s in want.rankings[qid]], abs=1e-6
        )


def test_fuse_runs_needs_the_same_candidates(tmp_path):
    from cisrank.data.runs import Run

    a = Run.from_scores("a", {"q": [("d1", 1.0), ("d2", 0.5)]})
    b = Run.from_scores("b", {"q": [("d1", 1.0)]})
    with pytest.raises(CisrankError, match="run 'b' has no score for docid 'd2'"):
        fuse_runs([a, b], [1.0, 1.0])


def test_cli_eval_fuse_equals_the_hybrid_reranker(tmp_path):
    """`cisrank eval fuse` of saved runs gives the figures of the in-process hybrid (linear, so
    the first stage's raw BM25 scores would differ from its ranks); bad specs are exit 2."""
    import json
    import subprocess
    import sys

    from cisrank.eval.metrics import evaluate

    folder = _two_queries(tmp_path)
    dataset = load_folder(folder)
    paths = {}
    for name, table in [("cis", A), ("dense", B)]:
        run = run_eval(dataset, TableReranker(name, table), progress=False).runs[RERANKED]
        paths[name] = run.write_trec(tmp_path / f"{name}.trec")
    hybrid = HybridReranker(
        components={"cis": TableReranker("cis", A)}, fuse="cis:0.7,first-stage:0.3"
    )
    want = evaluate(run_eval(dataset, hybrid, progress=False).runs[RERANKED], dataset.qrels)

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "cisrank.cli", "eval", "fuse", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=600,
        )

    runs_args = ["--run", f"cis={paths['cis']}", "--run", f"dense={paths['dense']}"]
    p = cli(
        *runs_args,
        "--fuse",
        "cis:0.7,first-stage:0.3",
        "--fusion",
        "linear",
        "--json",
        "--output",
        str(tmp_path / "out"),
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)["runs"]
    assert got["hybrid"] == pytest.approx(want)
    assert set(got) == {"first-stage", "cis", "dense", "hybrid"}
    assert (tmp_path / "out" / "run.trec").is_file()
    p = cli(*runs_args, "--fuse", "cis:1,bm99:1")
    assert p.returncode == 2 and "bm99: not among first-stage, cis, dense" in p.stderr
    assert "Traceback" not in p.stderr
    p = cli("--run", "cis", "--fuse", "cis:1")
    assert p.returncode == 2 and "give NAME=RUN.trec" in p.stderr
