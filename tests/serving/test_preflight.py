"""`cisrank.serving.preflight`: the pre-start checks run by `cisrank serve` and by every app of
`create_app` that loads its config (an app built with `create_app` once never got them)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cisrank.api.app import create_app
from cisrank.indexes.build import build_index
from cisrank.serving import PreflightError, preflight
from cisrank.serving.config import IndexSpec, RerankerSpec, ServerConfig

ROWS = [("p1", "the quick brown fox"), ("p2", "a lazy dog sleeps"), ("p3", "brown dogs run")]


@pytest.fixture
def damaged_index(tmp_path) -> tuple[Path, Path]:
    """A bm25 index with one bit of its document store flipped: (the folder, that file)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in ROWS))
    out = tmp_path / "idx"
    build_index("bm25", corpus, out, progress=False)
    docs = out / "docs.sqlite"
    data = bytearray(docs.read_bytes())
    data[len(data) // 2] ^= 0x01
    docs.write_bytes(bytes(data))
    return out, docs


def _config(index: Path) -> ServerConfig:
    # A factory no machine has: loading it would fail, so what fails first says what ran first.
    spec = RerankerSpec(kind="no_such_module_of_cisrank:make")
    return ServerConfig(rerankers={"mine": spec}, indexes={"idx": IndexSpec(path=index)})


def _loaded(app) -> tuple[int, dict]:
    """`/readyz` once loading has ended (the loader thread runs the checks, then loads)."""
    with TestClient(app, raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 30
        while True:
            r = client.get("/readyz")
            if r.json()["status"] != "loading" or time.monotonic() > deadline:
                return r.status_code, r.json()
            time.sleep(0.02)


def test_an_app_checks_its_indexes_before_it_loads_anything(damaged_index):
    index, docs = damaged_index
    reported: list[str | None] = []
    status, body = _loaded(create_app(_config(index), on_loaded=reported.append, api_keys=[]))
    assert status == 503 and body["status"] == "failed"
    # clients see the component, never the server path; the operator's line names the file
    assert body["detail"]["error"] == (
        "index 'idx' failed its pre-start check; details are in the server log"
    )
    assert str(index) not in json.dumps(body)
    (line,) = reported
    assert line.startswith("index 'idx': ") and str(docs) in line and "damaged file" in line


def test_an_app_whose_checks_ran_already_goes_straight_to_loading(damaged_index):
    """`cisrank serve` checks before it binds its port and builds its workers' apps with
    `preflight=False`: the first fault they meet is the model's, not the index's again."""
    index, _ = damaged_index
    reported: list[str | None] = []
    app = create_app(_config(index), on_loaded=reported.append, api_keys=[], preflight=False)
    status, body = _loaded(app)
    assert status == 503
    assert (
        body["detail"]["error"] == "reranker 'mine' failed to load; details are in the server log"
    )
    assert reported[0].startswith("reranker 'mine' failed to load: ")


def test_preflight_names_the_first_faulty_component_indexes_first(tmp_path, damaged_index):
    index, docs = damaged_index
    store = tmp_path / "priors.sqlite"
    store.write_bytes(b"not a database" * 300)
    cis = RerankerSpec(kind="cis", model="m", options={"prior_store": str(store)})
    missing = tmp_path / "gone"
    config = ServerConfig(
        rerankers={"cis": cis},
        indexes={"first": IndexSpec(path=missing), "second": IndexSpec(path=index)},
    )
    with pytest.raises(PreflightError) as caught:
        preflight(config)
    assert caught.value.component == "index 'first'"
    assert str(caught.value) == f"index 'first': path '{missing}' does not exist"
    with pytest.raises(PreflightError) as caught:
        preflight(config.model_copy(update={"indexes": {"second": IndexSpec(path=index)}}))
    assert caught.value.component == "index 'second'" and str(docs) in str(caught.value)
    with pytest.raises(PreflightError, match=r"^reranker 'cis': .*priors\.sqlite: damaged file"):
        preflight(config.model_copy(update={"indexes": {}}))
