"""`cisrank serve` checks every configured index completely before the server starts: a half-built
or damaged index (or an unreadable prior store) is one line and exit 2, not a server that
answers 503 with `Retry-After: 1` for ever."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from serve_process import one_error_line, run_serve

from cisrank.cli.serve import server_config
from cisrank.errors import CisrankError
from cisrank.indexes.build import STATE_FILE, build_index

ROWS = [("p1", "the quick brown fox"), ("p2", "a lazy dog sleeps"), ("p3", "brown dogs run")]


@pytest.fixture
def index(tmp_path) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in ROWS))
    out = tmp_path / "idx"
    build_index("bm25", corpus, out, progress=False)
    return out


def test_serve_refuses_a_half_built_index(index):
    (index / "manifest.json").unlink()  # what a killed build leaves: files, a state, no manifest
    (index / STATE_FILE).write_text("{}")
    one_error_line(run_serve("--index", str(index)), 2, "index 'idx'", "not a complete index")


def test_serve_refuses_a_damaged_index(index):
    docs = index / "docs.sqlite"
    data = bytearray(docs.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit
    docs.write_bytes(bytes(data))
    one_error_line(run_serve("--index", str(index)), 2, "index 'idx'", str(docs), "damaged")


def test_an_intact_index_passes_and_a_damaged_prior_store_does_not(index, tmp_path):
    cfg = server_config(None, "dense", "some/model", [index])  # hashes every file: intact
    assert list(cfg.indexes) == ["idx"]
    store = tmp_path / "priors.sqlite"
    store.write_bytes(b"not a database" * 300)
    config = tmp_path / "server.json"
    config.write_text(
        json.dumps(
            {
                "rerankers": {
                    "cis": {"kind": "cis", "model": "m", "options": {"prior_store": str(store)}}
                }
            }
        )
    )
    with pytest.raises(CisrankError, match=r"reranker 'cis': .*priors\.sqlite: damaged file"):
        server_config(config)
