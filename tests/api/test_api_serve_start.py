"""`cisrank serve` at its start: a damaged prior store refuses the start as `index verify` refuses
it (and a store damaged later is a 500 naming the reranker and the store); a model that cannot load
stops the server with one line; a port in use is one line and exit 2; "ready on http://HOST:PORT"
once loaded; the help lists the real kinds and every route."""

from __future__ import annotations

import json
import socket
import sqlite3
import struct
import time
from pathlib import Path

import pytest
from serve_process import ServeProcess, one_error_line, run_serve
from typer.testing import CliRunner

from cisrank import testing
from cisrank.cli import app
from cisrank.cli.serve import server_config
from cisrank.errors import CisrankError
from cisrank.rerank.prior_store import PriorStore

# ------------------------------------------------------------------ a damaged prior store


def _store(path: Path, rows: int = 3000) -> Path:
    store = PriorStore(path)
    # values that are not whole numbers (SQLite writes a whole REAL as an integer)
    store.put_many("fp", [(f"{i:032x}", -1.001 - i / 7.0, 1 + i % 50) for i in range(rows)])
    store.close()
    return path


def _flip_every_value(path: Path) -> None:
    """The lowest mantissa bit of every stored log p(K) (SQLite's integrity_check sees none)."""
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every row in the file itself
    values = [v for (v,) in con.execute("SELECT logprob FROM priors")]
    con.close()
    assert values
    data = bytearray(path.read_bytes())
    for value in values:
        at = data.find(struct.pack(">d", value))
        assert at > 0
        data[at + 7] ^= 0x01
    path.write_bytes(bytes(data))


def _flip_64_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    start = len(data) // 2 - 32
    for i in range(start, start + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _zero_a_range(path: Path) -> None:
    data = bytearray(path.read_bytes())
    start = len(data) // 2
    data[start : start + 4096] = bytes(4096)
    path.write_bytes(bytes(data))


DAMAGES = {"every-value": _flip_every_value, "64B": _flip_64_bytes, "zeroed": _zero_a_range}


def _config(tmp_path: Path, store: Path) -> Path:
    cfg = tmp_path / "server.json"
    spec = {"kind": "cis", "model": "some-model", "options": {"prior_store": str(store)}}
    cfg.write_text(json.dumps({"rerankers": {"cis": spec}}), encoding="utf-8")
    return cfg


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_prior_store_refuses_the_start_as_index_verify_does(tmp_path, damage):
    store = _store(tmp_path / "priors.sqlite")
    cfg = _config(tmp_path, store)
    assert server_config(cfg).rerankers["cis"].options["prior_store"] == str(store)  # intact
    DAMAGES[damage](store)
    with pytest.raises(CisrankError, match=r"reranker 'cis': .*priors\.sqlite: damaged file"):
        server_config(cfg)


def test_serve_exits_2_with_one_line_on_a_damaged_prior_store(tmp_path):
    store = _store(tmp_path / "priors.sqlite")
    _flip_every_value(store)
    proc = run_serve("--config", str(_config(tmp_path, store)), "--port", "0")
    one_error_line(proc, 2, "reranker 'cis'", str(store), "damaged file")


def test_a_prior_store_damaged_while_served_is_a_500_naming_reranker_and_store(
    tmp_path, tiny_gpt2_dir
):
    from fastapi.testclient import TestClient

    from cisrank.api.app import create_app
    from cisrank.rerank.cis import CISReranker
    from cisrank.serving.config import RerankerSpec, ServerConfig

    store = tmp_path / "priors.sqlite"
    options = {"estimator": "forward", "prior_store": str(store)}
    spec = {"cis": RerankerSpec(kind="cis", model="m", options=options)}
    body = {"query": "who wrote hamlet", "documents": testing.SAMPLE_SENTENCES[:4]}

    def client() -> TestClient:
        reranker = CISReranker(
            model=str(tiny_gpt2_dir), prior_store=str(store), estimator="forward"
        )
        app = create_app(ServerConfig(rerankers=spec), rerankers={"cis": reranker}, api_keys=[])
        return TestClient(app, raise_server_exceptions=False)

    with client() as c:
        assert c.post("/v1/rerank", json=body).status_code == 200  # the priors are stored
    _flip_every_value(store)
    with client() as c:
        r = c.post("/v1/rerank", json=body)
    assert r.status_code == 500, r.text
    message = r.json()["message"]
    assert "reranker 'cis'" in message and "'priors.sqlite'" in message, message
    assert "damaged" in message and str(tmp_path) not in r.text


# ------------------------------------------------------------------------ start and stop


def test_a_port_in_use_is_one_line_and_exit_2():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_serve("-r", "api_fakes:slow_reranker", "--port", str(port))
    one_error_line(proc, 2, f"cannot listen on 127.0.0.1:{port}", "in use")
    assert proc.stderr.strip().count("\n") == 0, proc.stderr  # nothing else: no uvicorn log


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_model_that_cannot_load_stops_serve_with_one_line(workers):
    """It stayed up forever answering 503 `load_failed`."""
    started = time.monotonic()
    proc = run_serve("-r", "api_fakes:broken_reranker", "--port", "0", "--workers", workers)
    one_error_line(
        proc,
        2,
        "reranker 'broken_reranker' failed to load: OSError: cannot read the weights",
        "the server stopped",
    )
    assert "ready on" not in proc.stderr
    assert time.monotonic() - started < 50


def test_ready_line_once_loaded_then_sigterm_exits_0(tmp_path):
    import httpx

    with ServeProcess("-r", "api_fakes:slow_reranker", log=tmp_path / "serve.log") as served:
        assert served.ready_line.startswith("ready on http://127.0.0.1:"), served.ready_line
        assert httpx.get(served.url + "/readyz", timeout=5).status_code == 200
        assert served.stop() == 0


def test_serve_help_lists_the_real_kinds_and_every_route():
    from cisrank.rerank.registry import KINDS

    text = CliRunner().invoke(app, ["serve", "--help"], terminal_width=300).output
    text = " ".join(text.split())
    assert "distilled" not in text
    for kind in KINDS:
        assert kind in text, kind
    for route in ["/v1/rerank", "/v1/search", "/v1/context", "/v1/generate", "/v1/embeddings"]:
        assert route in text, route
    for route in ["/v1/models", "/healthz", "/readyz", "/metrics"]:
        assert route in text, route
    # --reranker names its choices, and no first stage (serve has none)
    rows = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "300"}).output
    row = next(line for line in rows.splitlines() if line.strip("│ ").startswith("--reranker"))
    assert "(cis, cross-encoder, dense, hybrid, student, or package.module:factory" in row, row
    assert "first-stage" not in row and "..." not in row, row
    # the server config's schema (OpenAPI-like docs of `kind`) offers no 'distilled' kind either
    from cisrank.serving.config import RerankerSpec

    kind_help = RerankerSpec.model_fields["kind"].description or ""
    assert "(cis, cross-encoder, dense, hybrid, student:" in kind_help
    assert "distilled," not in kind_help


def test_a_damaged_pulled_model_refuses_the_start(tmp_path, monkeypatch):
    """The server's start hashes a pulled model in full (`cisrank.models.integrity`): a changed
    byte is one line naming the file, before any worker loads it."""
    integrity = pytest.importorskip("cisrank.models.integrity")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # stamps, if any, go here
    folder = tmp_path / "tiny-pull"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    files, _ = integrity.record_files(folder)
    provenance = integrity.seal({"name": "tiny-pull", "files": files})
    (folder / integrity.PROVENANCE_FILE).write_text(json.dumps(provenance), encoding="utf-8")
    assert server_config(None, "dense", str(folder)).rerankers["dense"].model == str(folder)
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[5000] ^= 0x01
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CisrankError, match=r"reranker 'dense': .*model\.safetensors: damaged"):
        server_config(None, "dense", str(folder))
