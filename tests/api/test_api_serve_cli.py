"""`cisrank serve` without a config file: `--reranker KIND --model M [--index PATH ...]` builds the
ServerConfig handed to the workers; `--config` and the quick-start options exclude each other; the
config reaches the workers bound to their app factory, not through the environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cisrank.cli import app
from cisrank.cli.serve import server_config
from cisrank.errors import CisrankError
from cisrank.serving.config import IndexSpec, RerankerSpec, ServerConfig


@pytest.fixture
def served(monkeypatch):
    """Runs `cisrank serve ARGS` up to uvicorn; returns (the config the workers get, kwargs)."""
    # These tests are about the config's shape (empty folders stand for indexes, catalogue names
    # for models this host may not have pulled); the complete checks of each index and model at
    # start have their own tests (tests/indexes/test_serve_check.py, tests/models/test_integrity.py).
    monkeypatch.setattr("cisrank.serving.checks.check_index", lambda path: None)
    monkeypatch.setattr("cisrank.serving.checks.check_model", lambda spec: None)
    calls = []

    def run_server(cfg, host, port, workers):
        calls.append((cfg, {"host": host, "port": port, "workers": workers}))

    monkeypatch.setattr("cisrank.cli.serve.run_server", run_server)

    def run(*args: str):
        result = CliRunner().invoke(app, ["serve", *args])
        if result.exception is not None:
            raise result.exception
        assert result.exit_code == 0, result.output
        assert len(calls) == 1
        return calls.pop()

    return run


def test_quick_start_serves_one_reranker_and_indexes_named_by_folder(served, tmp_path):
    (tmp_path / "msmarco").mkdir()
    (tmp_path / "sub" / "dl19").mkdir(parents=True)
    cfg, kwargs = served(
        *("--reranker", "dense", "--model", "org/tiny-model"),
        *("--index", str(tmp_path / "msmarco"), "--index", str(tmp_path / "sub" / "dl19")),
        *("--port", "9123", "--workers", "2"),
    )
    assert cfg == ServerConfig(
        rerankers={"dense": RerankerSpec(kind="dense", model="org/tiny-model")},
        indexes={
            "msmarco": IndexSpec(path=tmp_path / "msmarco"),
            "dl19": IndexSpec(path=tmp_path / "sub" / "dl19"),
        },
    )
    assert (kwargs["port"], kwargs["workers"], kwargs["host"]) == (9123, 2, "127.0.0.1")


def test_quick_start_names(served, tmp_path):
    cfg, _ = served("--reranker", "cis")
    assert cfg.rerankers == {"cis": RerankerSpec(kind="cis")} and cfg.indexes == {}
    cfg, _ = served("--reranker", "api_fakes:slow_reranker", "--model", "org/overlap-v2/")
    assert cfg.rerankers == {
        "overlap-v2": RerankerSpec(kind="api_fakes:slow_reranker", model="org/overlap-v2/")
    }


def test_quick_start_factory_without_model_is_named_after_the_factory(served):
    cfg, _ = served("-r", "api_fakes:slow_reranker")
    assert list(cfg.rerankers) == ["slow_reranker"]


def test_an_index_alone_keeps_the_default_reranker(served, tmp_path):
    cfg, _ = served("--index", str(tmp_path))
    assert cfg == ServerConfig(indexes={tmp_path.name: IndexSpec(path=tmp_path)})
    assert cfg.rerankers == ServerConfig().rerankers


def test_no_options_keep_the_default_config(served):
    assert served()[0] == ServerConfig()


def test_chunking_flags_set_the_servers_chunking_over_its_config(served, tmp_path):
    from cisrank.rerank.chunking import Chunking

    cfg = served("--chunk-overlap-tokens", "8", "--chunk-pooling", "mean")[0]
    assert cfg.chunking == Chunking(overlap_tokens=8, pooling="mean")
    assert cfg.rerankers == ServerConfig().rerankers
    path = tmp_path / "server.json"
    path.write_text('{"chunking": {"window_tokens": 100, "pooling": "first"}}', encoding="utf-8")
    cfg = served("--config", str(path), "--chunk-window-tokens", "50")[0]
    assert cfg.chunking == Chunking(window_tokens=50, pooling="first")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"config": "server.json", "reranker": "dense"}, "either --config or --reranker, not"),
        ({"config": "server.json", "indexes": ["a"]}, "either --config or --index, not"),
        ({"model": "m"}, "--model needs --reranker KIND"),
        ({"reranker": "nope"}, "reranker 'nope': unknown reranker 'nope'"),
        ({"reranker": "none"}, "kind 'none' cannot be served"),
        ({"reranker": "dense", "indexes": ["a", "b/a"]}, "two indexes are named 'a'"),
        ({"reranker": "dense", "indexes": ["missing"]}, "index 'missing': path"),
        ({"reranker": "dense", "indexes": ["bad name"]}, "must match"),
    ],
)
def test_quick_start_errors(tmp_path, args, needle):
    for folder in ("a", "b/a", "bad name"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "server.json").write_text("{}", encoding="utf-8")
    config = tmp_path / args["config"] if "config" in args else None
    indexes = [tmp_path / p for p in args.get("indexes", [])]
    with pytest.raises(CisrankError, match=needle):
        server_config(config, args.get("reranker"), args.get("model"), indexes)


def test_config_and_quick_start_together_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "server.json"
    cfg.write_text("{}", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "cisrank.cli", "serve", "--config", str(cfg), "-r", "dense"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr
    assert "either --config or --reranker, not both" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


# ----------------------------------------------------------- every option of a kind is a flag


def test_a_bare_serve_serves_minilm_int8_the_student_and_float32_embeddings():
    """No flags: all-MiniLM-L6-v2 on `--backend auto` answers /v1/rerank (the first, so the
    default reranker), the shipped student is served by name, and the same bi-encoder in float32
    answers /v1/embeddings."""
    cfg = ServerConfig()
    assert cfg.rerankers == {
        "dense": RerankerSpec(kind="dense", options={"backend": "auto"}),
        "student": RerankerSpec(kind="student"),
        "dense-float32": RerankerSpec(
            kind="dense", options={"backend": "auto", "dtype": "float32"}
        ),
    }
    assert cfg.default_reranker_name == "dense" and cfg.embeddings == "dense-float32"
    # rerankers of one's own leave /v1/embeddings to the default reranker's encoder
    own = ServerConfig(rerankers={"d": RerankerSpec(kind="dense")})
    assert own.embeddings is None
    with pytest.raises(ValueError, match="embeddings 'x' is not one of the configured rerankers"):
        ServerConfig(rerankers={"d": RerankerSpec(kind="dense")}, embeddings="x")


def test_reranker_options_are_serve_flags(served):
    cfg, _ = served(
        *("--reranker", "cis", "--estimator", "forward", "--template", "qa"),
        *("--max-doc-tokens", "64", "--backend", "torch", "--normalize", "mean"),
    )
    assert cfg.rerankers == {
        "cis": RerankerSpec(
            kind="cis",
            options={
                "estimator": "forward",
                "template": "qa",
                "max_doc_tokens": 64,
                "backend": "torch",
                "normalize": "mean",
            },
        )
    }
    cfg, _ = served(
        *("--reranker", "hybrid", "--model", "smollm2-135m-instruct"),
        *("--fuse", "cis:0.2,first-stage:0.1,dense:0.7", "--fusion", "rrf", "--rrf-k", "30"),
        *("--models", "dense=all-mpnet-base-v2", "--estimator", "reverse"),
    )
    assert cfg.rerankers["hybrid"].options == {
        "fuse": "cis:0.2,first-stage:0.1,dense:0.7",
        "fusion": "rrf",
        "rrf_k": 30.0,
        "models": {"dense": "all-mpnet-base-v2"},
        "estimator": "reverse",
    }
    cfg, _ = served("--reranker", "cis", "--estimator", "forward", "--no-prior")
    assert cfg.rerankers["cis"].options == {"estimator": "forward", "prior": False}
    cfg, _ = served("--reranker", "dense", "--query-prefix", "query: ", "--batch-size", "4")
    assert cfg.rerankers["dense"].options == {"query_prefix": "query: ", "batch_size": 4}
    cfg, _ = served("--reranker", "student", "--backend", "torch", "--dtype", "float32")
    assert cfg.rerankers["student"].options == {"backend": "torch", "dtype": "float32"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--estimator", "forward"], "--estimator needs --reranker KIND"),
        (["-r", "dense", "--template", "qa"], r"--template: option\(s\) of the cis reranker"),
        (["-r", "cis", "--estimator", "sideways"], "estimator: Input should be"),
        (
            ["-r", "cis", "--fuse", "cis:1"],
            r"--fuse: (not options of cis|option\(s\) of the hybrid)",
        ),
        (["-r", "hybrid", "--fuse", "cis:x"], "weight 'x' is not a number"),
        (["-r", "hybrid", "--models", "dense"], "give KEY=VALUE pairs"),
        (["--config", "server.json", "--estimator", "reverse"], "either --config or --estimator"),
        (
            ["--chunk-window-tokens", "4", "--chunk-overlap-tokens", "4"],
            "overlap_tokens 4 must be under window_tokens 4",
        ),
        (["--chunk-pooling", "sum"], "pooling: Input should be 'max', 'mean' or 'first'"),
    ],
)
def test_serve_flag_errors_are_one_line_exit_2(tmp_path, args, needle):
    """A usage error (typer's, exit 2) or a CisrankError, which `cisrank`'s main prints as one
    line with exit 2, before anything loads."""
    import re

    (tmp_path / "server.json").write_text("{}", encoding="utf-8")
    args = [str(tmp_path / a) if a == "server.json" else a for a in args]
    result = CliRunner().invoke(app, ["serve", *args])
    if isinstance(result.exception, CisrankError):
        message = str(result.exception)
        assert "\n" not in message
    else:
        assert result.exit_code == 2, result.output
        message = result.output
    assert re.search(needle, message), message


def test_serve_help_lists_every_kinds_options_by_kind():
    import re

    from cli.helpers import help_pages

    # the main help and each kind's page (`--help-kind KIND`)
    text = "".join(help_pages("serve").values())
    panels = re.findall(r"--reranker ([a-z| -]+?)(?::|\s─)", text)
    for kind in ("cis", "dense", "hybrid", "student", "cross-encoder"):
        assert any(kind in p for p in panels), (kind, panels)
    for flag in ("--estimator", "--template", "--reverse-template", "--fuse", "--fusion",
                 "--models", "--backend", "--dtype", "--quantize", "--query-prefix",
                 "--max-doc-tokens", "--prior-store", "--rrf-k", "--no-prior"):  # fmt: skip
        assert flag in text, flag


def test_the_workers_get_the_config_bound_to_their_factory(monkeypatch, tmp_path):
    """`run_server` hands uvicorn `served_app` with the config and the status folder bound,
    and the guarded protocol with the config's limits bound: both survive pickling (what
    uvicorn does to start each worker of --workers N) with their values, and no `CISRANK_`
    variable carries them."""
    import pickle

    import uvicorn

    from cisrank.api.app import served_app
    from cisrank.cli.serve import run_server
    from cisrank.serving.config import Limits

    seen = []

    class FakeServer:
        def __init__(self, config: uvicorn.Config) -> None:
            seen.append(config)
            self.started = True

        def run(self, sockets=None) -> None:
            pass

    monkeypatch.setattr(uvicorn, "Server", FakeServer)
    monkeypatch.setattr("signal.signal", lambda *a: None)  # the test process keeps its handler
    before = {k for k in os.environ if k.startswith("CISRANK_")}
    cfg = ServerConfig(
        rerankers={"overlap": RerankerSpec(kind="api_fakes:slow_reranker", model="m")},
        limits=Limits(max_header_bytes=4096, max_headers=7),
    )
    assert run_server(cfg, "127.0.0.1", 0, 1) is None
    (config,) = seen
    factory = pickle.loads(pickle.dumps(config.app))
    assert config.factory and factory.func is served_app
    assert factory.args[0] == cfg and factory.args[0] is not cfg
    protocol = pickle.loads(pickle.dumps(config.http))
    assert protocol.keywords["limits"].max_header_bytes == 4096
    assert protocol.keywords["limits"].max_headers == 7
    assert {k for k in os.environ if k.startswith("CISRANK_")} == before
