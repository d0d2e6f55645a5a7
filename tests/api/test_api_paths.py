"""No HTTP answer carries a server path, and a server fault is never blamed on the client.

Before: a damaged document store row answered 400 `invalid_request` with the absolute file path;
`/readyz` (open even when API keys are set) and every 503 carried the load error with its paths;
`/v1/models` listed absolute index paths. Each test here serves indexes and model folders from
pytest's temporary folders and scans every answer for that folder.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest
from api_fakes import OverlapReranker
from fastapi.testclient import TestClient

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.errors import CisrankError
from cisrank.indexes.build import build_index
from cisrank.retrieval.docstore import DOCSTORE_FILE
from cisrank.serving.config import IndexSpec, RerankerSpec, ServerConfig


@pytest.fixture
def base(tmp_path_factory) -> str:
    """The folder every temporary path of this session is under: no answer may name it."""
    return str(tmp_path_factory.getbasetemp())


def _bm25(folder: Path) -> Path:
    corpus = folder / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "text": t}) + "\n"
            for i, t in enumerate(testing.SAMPLE_SENTENCES)
        )
    )
    build_index("bm25", corpus, folder / "books", progress=False)
    return folder / "books"


def _fake(name: str = "ov", model: str | None = None) -> RerankerSpec:
    return RerankerSpec(kind="api_fakes:slow_reranker", model=model, options={"delay": 0})


def _answers(client: TestClient) -> list:
    """Every route's answer (with a key, so that the protected ones answer too)."""
    auth = {"Authorization": "Bearer k"}
    return [
        client.get("/healthz"),
        client.get("/readyz"),
        client.get("/v1/models", headers=auth),
        client.get("/metrics", headers=auth),
        client.post("/v1/rerank", json={"query": "q", "documents": ["a"]}, headers=auth),
        client.post("/v1/search", json={"query": "hamlet"}, headers=auth),
        client.post("/v1/search", json={"query": "hamlet", "rerank": "ov"}, headers=auth),
    ]


def _path_free(answers, base: str) -> None:
    for r in answers:
        assert base not in r.text, (r.request.url.path, r.status_code, r.text)


def test_a_damaged_docstore_row_is_a_500_naming_the_index_not_the_file(tmp_path, base, caplog):
    """Damage after the index was opened and checked (a file changed under a running server):
    found at query time, a server fault, never the client's, and no path in the answer."""
    index = _bm25(tmp_path)
    cfg = ServerConfig(rerankers={"ov": _fake()}, indexes={"books": IndexSpec(path=index)})
    with TestClient(create_app(cfg, api_keys=["k"])) as client:
        assert client.app.state.serving.wait_ready(30), client.app.state.serving.error
        with sqlite3.connect(index / DOCSTORE_FILE) as con:  # every passage's row is gone
            con.execute("DELETE FROM docs")
        with caplog.at_level(logging.ERROR, logger="cisrank.serving.ranking"):
            answers = _answers(client)
        search = answers[5]
        assert search.status_code == 500, search.text
        body = search.json()
        assert body["error"] == "internal_error" and "index 'books'" in body["message"], body
        assert answers[6].status_code == 500
        assert [r.status_code for r in answers[:5]] == [200, 200, 200, 200, 200]
        _path_free(answers, base)
    assert str(index / DOCSTORE_FILE) in caplog.text  # the details went to the log


def test_a_corrupt_docstore_file_is_a_500_without_the_path(tmp_path, base):
    index = _bm25(tmp_path)
    store = index / DOCSTORE_FILE
    data = bytearray(store.read_bytes())
    data[4096:] = b"\xff" * (len(data) - 4096)  # every page after the header page
    store.write_bytes(bytes(data))
    cfg = ServerConfig(rerankers={"ov": _fake()}, indexes={"books": IndexSpec(path=index)})
    with TestClient(create_app(cfg, api_keys=["k"]), raise_server_exceptions=False) as client:
        client.app.state.serving.wait_ready(30)
        answers = _answers(client)
        assert all(r.status_code < 400 or r.status_code in (500, 503) for r in answers)
        assert any(r.status_code in (500, 503) for r in answers)
        _path_free(answers, base)


@pytest.mark.parametrize("broken", ["index", "reranker"])
def test_readyz_and_every_503_name_the_component_without_its_path(tmp_path, base, broken):
    """A missing index folder or model folder: ready or not, and which component, no path."""
    missing = tmp_path / "nowhere" / "gone"
    if broken == "index":
        cfg = ServerConfig(rerankers={"ov": _fake()}, indexes={"gone": IndexSpec(path=missing)})
    else:
        cfg = ServerConfig(rerankers={"ov": RerankerSpec(kind="dense", model=str(missing))})
    with TestClient(create_app(cfg, api_keys=["k"])) as client:
        assert not client.app.state.serving.wait_ready(60)
        answers = _answers(client)
        ready = answers[1]
        assert ready.status_code == 503
        assert ready.json()["status"] == "failed"
        component = "index 'gone'" if broken == "index" else "reranker 'ov'"
        assert component in ready.json()["detail"]["error"], ready.json()
        assert answers[4].status_code == 503 and component in answers[4].json()["message"]
        # Permanent until restarted with a fixed configuration: never "retry in 1 s".
        assert answers[4].json()["error"] == "load_failed"
        assert "retry-after" not in ready.headers and "retry-after" not in answers[4].headers
        _path_free(answers, base)


def test_models_lists_names_and_kinds_not_folders(tmp_path, base):
    index = _bm25(tmp_path)
    model = tmp_path / "models" / "my-reranker"
    cfg = ServerConfig(
        rerankers={"ov": _fake(model=str(model))}, indexes={"books": IndexSpec(path=index)}
    )
    with TestClient(create_app(cfg, api_keys=["k"])) as client:
        assert client.app.state.serving.wait_ready(30), client.app.state.serving.error
        answers = _answers(client)
        listed = answers[2].json()
        assert listed["indexes"] == [{"id": "books", "kind": "bm25"}]
        assert [(m["id"], m["model"]) for m in listed["data"]] == [("ov", "my-reranker")]
        _path_free(answers, base)
        # the listed id names the model in a request, like the folder it stands for
        for name in ("my-reranker", str(model)):
            r = client.post(
                "/v1/rerank",
                json={"query": "q", "documents": ["q"], "model": name},
                headers={"Authorization": "Bearer k"},
            )
            assert r.status_code == 200 and r.json()["model"] == "ov", r.text


class _Strict(OverlapReranker):
    """Raises a user-facing error that quotes its model folder, as real rerankers' errors do."""

    def __init__(self, folder: str) -> None:
        super().__init__(model_name=folder)

    def score(self, query, passages):
        raise CisrankError(
            f"prefix plus passage exceed the context of '{self.model_name}': shorten the query"
        )


def test_a_request_error_quoting_a_model_folder_is_redacted(tmp_path, base):
    folder = str(tmp_path / "models" / "cis-gpt")
    cfg = ServerConfig(rerankers={"cis": RerankerSpec(kind="cis", model=folder)})
    app = create_app(cfg, rerankers={"cis": _Strict(folder)}, api_keys=[])
    with TestClient(app) as client:
        r = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert r.status_code == 400, r.text
        assert "exceed the context of '<cis file cis-gpt>'" in r.json()["message"], r.text
        assert base not in r.text
