"""The teacher set the repository carries (`teachers/`, what `make student` trains on): readable,
ids and scores only, its provenance complete, and every id found again in the training pool that
`distill pool` rebuilds from the real data."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cisrank.distill import teacher_set as TS
from cisrank.distill.trainset import build_pool

SET = Path(__file__).resolve().parents[2] / "teachers" / "msmarco-train-top20.parquet"


def test_the_committed_set_names_its_teachers_and_holds_no_text():
    ts = TS.load(SET)
    assert len(ts) == 19_880 and ts.components == ["cis", "dense"]
    lists = ts.by_query()
    assert len(lists) == 994 and max(len(v) for v in lists.values()) == 20
    for rows in lists.values():  # each query's list is its first-stage top, ranks 1..n
        assert [ts.rank[i] for i in rows] == list(range(1, len(rows) + 1))
    assert all(np.isfinite(v).all() for v in ts.scores.values())
    cis = ts.provenance["components"]["cis"]["teacher"]
    assert (cis["model"], cis["backend"], cis["dtype"], cis["estimator"]) == (
        "smollm2-135m-instruct",
        "onnx",
        "int8",
        "reverse",
    )
    assert cis["reverse_template"] == "upr" and len(cis["fingerprint"]) == 64
    assert ts.provenance["components"]["dense"]["teacher"]["model"] == "all-mpnet-base-v2"
    assert ts.provenance["commit"]


def test_every_id_is_found_in_the_pool_rebuilt_from_the_data(data_root, tmp_path):
    ts = TS.load(SET)
    build_pool(tmp_path / "pool", data_root)
    texts = TS.texts_of(ts, tmp_path / "pool")
    assert set(ts.qid) <= set(texts.queries)
    assert set(ts.docid) <= set(texts.passages)
