"""Against a real `cisrank serve` (uvicorn) process on 127.0.0.1: the official Cohere SDK, API
keys over the wire, graceful shutdown on SIGTERM, and the CLI's config errors."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from api_fakes import overlap
from serve_process import ServeProcess, run_serve, serve_env

from cisrank import testing

KEY = "test-key-0123456789"
DOCS = testing.SAMPLE_SENTENCES[:5]
QUERY = "who wrote hamlet"


def _config_file(tmp: Path, config: dict) -> str:
    path = tmp / "server.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def dense_server(tmp_path_factory, tiny_bert_dir):
    tmp = tmp_path_factory.mktemp("server")
    config = {"rerankers": {"tiny": {"kind": "dense", "model": str(tiny_bert_dir)}}}
    with ServeProcess(
        *("--config", _config_file(tmp, config), "--host", "127.0.0.1"),
        log=tmp / "server.log",
        env=serve_env(CISRANK_API_KEYS=KEY, CISRANK_LOG_LEVEL="INFO"),
    ) as server:
        yield server
        log = server.output()
    # the log was captured (whichever rerank route this worker's tests of the module called:
    # under pytest-xdist a module's tests are spread over workers)...
    assert "loaded reranker tiny" in log and "rerank HTTP/1.1" in log
    assert KEY not in log  # ...and holds no key


def test_cohere_client_v2_reranks_unmodified(dense_server, tiny_dense):
    import cohere

    co = cohere.ClientV2(api_key=KEY, base_url=dense_server.url, timeout=30)
    response = co.rerank(model="tiny", query=QUERY, documents=DOCS, top_n=3)
    expected = tiny_dense.score(QUERY, DOCS)
    order = sorted(range(len(DOCS)), key=lambda i: -expected[i])[:3]
    assert [r.index for r in response.results] == order
    for r in response.results:
        assert r.relevance_score == pytest.approx(expected[r.index], abs=1e-6)
    assert response.id and response.meta.billed_units.search_units == 1


def test_cohere_client_v1_reranks_unmodified(dense_server, tiny_dense):
    import cohere

    co = cohere.Client(api_key=KEY, base_url=dense_server.url, timeout=30)
    docs = [DOCS[0], {"text": DOCS[1]}, DOCS[2]]
    response = co.rerank(query=QUERY, documents=docs, model="tiny", top_n=2, return_documents=True)
    expected = tiny_dense.score(QUERY, DOCS[:3])
    order = sorted(range(3), key=lambda i: -expected[i])[:2]
    assert [r.index for r in response.results] == order
    assert [r.document.text for r in response.results] == [DOCS[i] for i in order]
    assert [r.relevance_score for r in response.results] == pytest.approx(
        [expected[i] for i in order], abs=1e-6
    )


def test_cohere_client_with_a_wrong_key_gets_401(dense_server):
    import cohere

    co = cohere.ClientV2(api_key="wrong", base_url=dense_server.url, timeout=30)
    with pytest.raises(cohere.errors.UnauthorizedError):
        co.rerank(model="tiny", query=QUERY, documents=DOCS)


def test_concurrent_http_requests_over_the_wire(dense_server, tiny_dense):
    queries = [QUERY, "where is paris", "fleas", "goldfish tank", "world war"]
    results: dict[str, dict] = {}

    def call(q: str) -> None:
        r = httpx.post(
            dense_server.url + "/v1/rerank",
            json={"query": q, "documents": DOCS},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=30,
        )
        results[q] = r.json()

    threads = [threading.Thread(target=call, args=(q,)) for q in queries]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for q in queries:
        got = {x["index"]: x["relevance_score"] for x in results[q]["results"]}
        assert [got[i] for i in range(len(DOCS))] == pytest.approx(
            tiny_dense.score(q, DOCS), abs=1e-6
        )
    assert httpx.get(dense_server.url + "/healthz").json()["status"] == "ok"


def test_quick_start_serves_a_model_and_an_index_without_a_config(
    tmp_path, tiny_bert_dir, tiny_dense
):
    """`cisrank serve --reranker dense --model M --index PATH`: the reranker is named after its
    kind (and answers to its model id), the index after its folder."""
    from cisrank.indexes.build import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(DOCS))
    )
    index = tmp_path / "hamlet-docs"
    build_index("bm25", corpus, index, progress=False)
    quick_start = ("--reranker", "dense", "--model", str(tiny_bert_dir), "--index", str(index))
    with ServeProcess(*quick_start, "--host", "127.0.0.1", log=tmp_path / "server.log") as server:
        models = httpx.get(server.url + "/v1/models").json()
        # a local folder is listed by its name only: no answer carries a server path
        assert models["data"] == [
            {"id": "dense", "object": "model", "kind": "dense", "model": tiny_bert_dir.name}
            | {"ready": True, "runtime": "torch", "dtype": "float32"}
        ]
        assert models["default"] == models["embeddings"] == "dense"
        assert models["indexes"] == [{"id": "hamlet-docs", "kind": "bm25"}]
        body = {"model": str(tiny_bert_dir), "query": QUERY, "documents": DOCS}
        r = httpx.post(server.url + "/v1/rerank", json=body, timeout=30)
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        assert [got[i] for i in range(len(DOCS))] == pytest.approx(
            tiny_dense.score(QUERY, DOCS), abs=1e-6
        )
        body = {"query": QUERY, "index": "hamlet-docs", "rerank": "dense", "top_n": 3}
        hits = httpx.post(server.url + "/v1/search", json=body, timeout=30).json()["results"]
        assert len(hits) == 3
        assert [h["rerank_score"] for h in hits] == pytest.approx(
            tiny_dense.score(QUERY, [h["text"] for h in hits]), abs=1e-6
        )


def test_sigterm_lets_the_in_flight_request_finish(tmp_path):
    marker = tmp_path / "scoring-started"
    config = {
        "rerankers": {
            "slow": {
                "kind": "api_fakes:slow_reranker",
                "options": {"delay": 1.5, "marker": str(marker)},
            }
        }
    }
    args = ("--config", _config_file(tmp_path, config), "--host", "127.0.0.1")
    with ServeProcess(*args, log=tmp_path / "server.log") as server:
        box: dict[str, httpx.Response] = {}
        body = {"query": "slow query", "documents": ["a slow passage", "query"]}
        thread = threading.Thread(
            target=lambda: box.setdefault(
                "r", httpx.post(server.url + "/v1/rerank", json=body, timeout=30)
            )
        )
        thread.start()
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), server.output()
        server.proc.send_signal(signal.SIGTERM)
        thread.join(30)
        # uvicorn shuts down gracefully, then re-raises the signal: `cisrank serve` exits 0
        assert server.proc.wait(30) == 0, server.output()
        r = box["r"]
        assert r.status_code == 200
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        assert got == {
            0: pytest.approx(overlap("slow query", "a slow passage")),
            1: pytest.approx(overlap("slow query", "query")),
        }


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        ('{"rerankers": {"x": {"kind": "nope"}}}', "unknown reranker 'nope'"),
        ('{"rerankers": {"x": {"kind": "dense", "typo": 1}}}', "rerankers.x.typo"),
    ],
)
def test_serve_config_errors_are_one_line_exit_2(tmp_path, content, needle):
    cfg = tmp_path / "server.json"
    if content is not None:
        cfg.write_text(content, encoding="utf-8")
    proc = run_serve("--config", str(cfg))
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
