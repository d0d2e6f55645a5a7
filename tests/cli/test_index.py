"""`cisrank index build` and `cisrank search` as a user runs them: their output is cisrank's own."""

from __future__ import annotations

import json

from cli.helpers import cli

from cisrank.testing import SAMPLE_SENTENCES


def test_bm25_build_and_search_print_no_bm25s_debug_lines_or_bars(tmp_path):
    """bm25s sets its logger to DEBUG when imported and draws bars of its own; neither shows."""
    corpus = tmp_path / "c.jsonl"
    rows = [{"id": f"d{i}", "text": t} for i, t in enumerate(SAMPLE_SENTENCES)]
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    build = cli("index", "build", "bm25", "--corpus", str(corpus), "--out", str(tmp_path / "i"))
    assert build.returncode == 0, build.stderr
    search = cli("search", "--index", str(tmp_path / "i"), "--query", "who wrote hamlet")
    assert search.returncode == 0, search.stderr
    for p in (build, search):
        assert "DEBUG" not in p.stderr and "BM25S" not in p.stderr and "bm25s:" not in p.stderr
    assert "bm25 analyze" in build.stderr  # cisrank's own bar stays (-q turns it off)
    assert "Hamlet" in search.stdout
