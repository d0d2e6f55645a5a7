"""The API's contract as one JSON file: `/openapi.json`, every command's `--help`, and the status,
content type, Retry-After and body of a fixed set of requests (every route, every wire shape,
valid and invalid) against an app of tiny in-process models. Issue 47 moved the engine out of
`api/` without changing any of it: record on the commit before a change and on the commit after,
on the same machine (the tiny models' float scores depend on the CPU), and compare.

    git worktree add /tmp/before BASE && cp tools/api_contract.py /tmp/before/tools/
    python /tmp/before/tools/api_contract.py /tmp/before.json   # imports cisrank from its checkout
    python tools/api_contract.py /tmp/after.json
    python tools/api_contract.py --compare /tmp/before.json /tmp/after.json   # exit 1 on a change

Runs in about a minute on 2 cores (it builds a tiny BERT and GPT-2 and loads them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the cisrank of this checkout, whatever is installed


def openapi() -> Any:
    from cisrank.api.app import create_app

    return create_app().openapi()


def help_texts() -> dict[str, str]:
    """Every command's and group's `--help`, 100 columns wide."""
    import typer.main
    from click.testing import CliRunner

    from cisrank.cli import app

    root = typer.main.get_command(app)
    out: dict[str, str] = {}

    def walk(command: Any, path: list[str]) -> None:
        result = CliRunner().invoke(root, [*path, "--help"], env={"COLUMNS": "100"})
        out[" ".join(path) or "(root)"] = result.output
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(root, [])
    return out


def _config_module() -> Any:
    """`cisrank.serving.config`, or where it was before issue 47."""
    try:
        from cisrank.serving import config
    except ImportError:  # before issue 47: the config lived in the API package
        from cisrank.api import config  # type: ignore[no-redef]
    return config


def answers() -> list[dict[str, Any]]:
    """The fixed requests and what the app answered (uuid ids masked, floats to 5 places)."""
    sys.path[:0] = [str(ROOT / "tests" / "api"), str(ROOT / "tests")]
    from api_fakes import ListRetriever, OverlapReranker
    from fastapi.testclient import TestClient

    from cisrank import testing
    from cisrank.api.app import create_app
    from cisrank.rerank.cis import CISReranker
    from cisrank.rerank.registry import load_reranker

    config = _config_module()
    tmp = Path(tempfile.mkdtemp())
    vocab = testing.words(testing.SAMPLE_SENTENCES)
    bert = testing.build_bert(tmp / "bert", vocab)
    gpt2 = testing.build_causal_lm(tmp / "gpt2", testing.word_level_tokenizer(vocab), "gpt2")
    rerankers = {
        "overlap": OverlapReranker(),
        "dense": load_reranker("dense", str(bert)),
        "cis": CISReranker(model=str(gpt2), template="qa"),
    }
    specs = {
        "overlap": config.RerankerSpec(kind="dense", model="/srv/models/overlap-v1"),
        "dense": config.RerankerSpec(kind="dense", model="sentence-transformers/all-MiniLM-L6-v2"),
        "cis": config.RerankerSpec(kind="cis", model=str(gpt2)),
    }
    limits = config.Limits(
        max_documents=6,
        max_document_chars=600,
        max_query_chars=200,
        max_request_cost=500,
        max_generate_documents=3,
        max_new_tokens=8,
    )
    corpus = {f"d{i}": s for i, s in enumerate(testing.SAMPLE_SENTENCES)}
    app = create_app(
        config.ServerConfig(rerankers=specs, limits=limits),
        rerankers=rerankers,
        retrievers={"docs": ListRetriever(corpus)},
        api_keys=[],
    )
    S = testing.SAMPLE_SENTENCES
    q = S[0].split()[0] + " " + S[1].split()[1]
    R = [
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
        ("GET", "/health", None),
        ("GET", "/info", None),
        ("GET", "/v1/models", None),
        ("POST", "/v1/rerank", {"query": q, "documents": S[:4]}),
        (
            "POST",
            "/v1/rerank",
            {
                "query": q,
                "documents": [{"text": S[0], "id": "a", "x": 1}, S[1]],
                "return_documents": True,
                "top_n": 1,
            },
        ),
        (
            "POST",
            "/v2/rerank",
            {"query": q, "documents": S[:3], "normalize": "minmax", "model": "dense"},
        ),
        (
            "POST",
            "/v1/rerank",
            {"query": q, "documents": S[:3], "normalize": "sigmoid", "model": "all-MiniLM-L6-v2"},
        ),
        ("POST", "/v1/rerank", {"query": q, "documents": S[:3], "model": "overlap-v1"}),
        ("POST", "/v1/rerank", {"query": q, "documents": S[:3], "model": "nope"}),
        ("POST", "/v1/rerank", {"query": q, "documents": S[:7]}),
        ("POST", "/v1/rerank", {"query": q, "documents": ["x" * 601]}),
        ("POST", "/v1/rerank", {"query": q, "documents": [{"text": "x" * 601}]}),
        ("POST", "/v1/rerank", {"query": "q" * 201, "documents": ["a"]}),
        (
            "POST",
            "/v1/rerank",
            {
                "query": q,
                "documents": S[:3],
                "max_tokens_per_doc": 2,
                "model": "dense",
                "return_documents": True,
            },
        ),
        ("POST", "/v1/rerank", {"query": q, "documents": ["a b " * 70] * 6, "model": "dense"}),
        ("POST", "/v1/rerank", {"query": q, "documents": S[:3], "top_k": 2}),
        ("POST", "/v1/rerank", {"query": q, "documents": S[:3], "topn": 2}),
        ("POST", "/v1/rerank", {"query": " ", "documents": S[:3]}),
        ("POST", "/rerank", {"query": q, "documents": S[:3]}),
        ("POST", "/rerank", {"query": q, "texts": S[:3]}),
        ("POST", "/rerank", {"query": q, "texts": S[:3], "raw_scores": True, "return_text": True}),
        ("POST", "/rerank", {"query": q, "texts": S[:3], "model": "dense"}),
        ("POST", "/rerank", {"query": q, "texts": S[:3], "truncation_direction": "left"}),
        ("POST", "/rerank", {"query": q, "texts": ["x" * 601]}),
        ("POST", "/rerank", {"query": q, "texts": S[:7]}),
        ("POST", "/rerank", {"query": q, "texts": S[:3], "model": "nope"}),
        ("POST", "/rerank", {"query": q, "texts": S[:3], "bogus": 1}),
        ("POST", "/v1/embeddings", {"input": S[0]}),
        (
            "POST",
            "/v1/embeddings",
            {"input": S[:2], "encoding_format": "base64", "model": "all-MiniLM-L6-v2"},
        ),
        ("POST", "/v1/embeddings", {"input": S[:2], "dimensions": 3}),
        ("POST", "/v1/embeddings", {"input": S[:2], "model": "overlap"}),
        ("POST", "/v1/embeddings", {"input": []}),
        ("POST", "/v1/embeddings", {"input": ["a", " "]}),
        ("POST", "/v1/embeddings", {"input": " "}),
        ("POST", "/v1/embeddings", {"input": ["a"] * 7}),
        ("POST", "/v1/embeddings", {"input": ["a b " * 70] * 6}),
        ("POST", "/v1/search", {"query": q}),
        (
            "POST",
            "/v1/search",
            {"query": q, "top_n": 2, "rerank": "overlap", "depth": 5, "normalize": "minmax"},
        ),
        ("POST", "/v1/search", {"query": q, "index": "nope"}),
        ("POST", "/v1/search", {"query": q, "top_n": 2000}),
        ("POST", "/v1/search", {"query": q, "top_n": 5, "depth": 3}),
        ("POST", "/v1/search", {"query": q, "rerank": "nope"}),
        ("POST", "/v1/context", {"query": q, "documents": S[:3], "model": "cis"}),
        (
            "POST",
            "/v1/context",
            {"query": q, "documents": S[:3], "arrange": "curvature", "pmi": True},
        ),
        (
            "POST",
            "/v1/context",
            {
                "query": q,
                "documents": [{"text": S[0], "title": "T", "id": 7}, S[1]],
                "arrange": "likelihood_select",
                "shuffles": 2,
                "seed": 3,
            },
        ),
        (
            "POST",
            "/v1/context",
            {"query": q, "documents": S[:3], "noise": {"n": 1, "documents": S[3:5]}},
        ),
        (
            "POST",
            "/v1/context",
            {"query": q, "documents": S[:3], "noise": {"n": 1, "index": "docs"}},
        ),
        (
            "POST",
            "/v1/context",
            {"query": q, "documents": S[:3], "rerank": {"reranker": "overlap", "top_k": 2}},
        ),
        ("POST", "/v1/context", {"query": q, "documents": S[:3], "model": "dense"}),
        ("POST", "/v1/context", {"query": q, "documents": [" "]}),
        ("POST", "/v1/context", {"query": q, "documents": [{"text": "x" * 601}]}),
        ("POST", "/v1/context", {"query": q, "documents": S[:3], "template": "{nope}"}),
        ("POST", "/v1/context", {"query": q, "documents": S[:3], "fields": {"question": "x"}}),
        ("POST", "/v1/context", {"query": q, "documents": S[:3], "document_format": "{text}" * 50}),
        ("POST", "/v1/context", {"query": q, "documents": S[:3], "shuffles": 9}),
        ("POST", "/v1/generate", {"query": q, "documents": S[:2], "max_new_tokens": 3}),
        (
            "POST",
            "/v1/generate",
            {"query": q, "documents": S[:2], "max_new_tokens": 3, "decoding": "leens"},
        ),
        (
            "POST",
            "/v1/generate",
            {
                "query": q,
                "documents": S[:2],
                "max_new_tokens": 3,
                "decoding": "replug",
                "scores": [1.0, 0.5],
            },
        ),
        (
            "POST",
            "/v1/generate",
            {
                "query": q,
                "documents": S[:3],
                "max_new_tokens": 2,
                "decoding": "replug",
                "rerank": {"reranker": "overlap", "top_k": 2},
            },
        ),
        ("POST", "/v1/generate", {"query": q, "documents": S[:2], "max_new_tokens": 30}),
        ("POST", "/v1/generate", {"query": q, "documents": S[:4], "max_new_tokens": 3}),
        (
            "POST",
            "/v1/generate",
            {"query": q, "documents": S[:2], "decoding": "replug", "max_new_tokens": 3},
        ),
        (
            "POST",
            "/v1/generate",
            {"query": q, "documents": S[:2], "scores": [1.0], "max_new_tokens": 3},
        ),
        (
            "POST",
            "/v1/generate",
            {"query": q, "documents": S[:2], "decoding": "clehe", "layers": [0, 1, 2, 3, 4]},
        ),
        ("POST", "/v1/generate", {"query": q, "documents": S[:2], "tau": 0, "max_new_tokens": 3}),
        ("POST", "/v1/rerank", b"{not json"),
        ("POST", "/v1/rerank", b'{"query": "\\ud800", "documents": ["a"]}'),
        ("GET", "/nope", None),
        ("POST", "/v1/rerank", {"query": q, "documents": ["a b " * 140] * 6, "model": "cis"}),
        ("POST", "/v1/context", {"query": q, "documents": ["a b " * 140] * 6}),
        (
            "POST",
            "/v1/generate",
            {
                "query": q,
                "documents": S[:3],
                "max_new_tokens": 3,
                "decoding": "avg_ens",
                "rerank": {"reranker": "overlap", "top_k": 5},
            },
        ),
    ]

    def mask(v: Any) -> Any:
        if isinstance(v, dict):
            return {
                k: "<id>" if k == "id" and isinstance(x, str) and len(x) == 36 else mask(x)
                for k, x in v.items()
            }
        if isinstance(v, list):
            return [mask(x) for x in v]
        return round(v, 5) if isinstance(v, float) else v

    out: list[dict[str, Any]] = []
    with TestClient(app, raise_server_exceptions=False) as client:
        for method, path, body in R:
            if isinstance(body, bytes):
                headers = {"content-type": "application/json"}
                r = client.request(method, path, content=body, headers=headers)
                body = body.decode()
            else:
                r = client.request(method, path, json=body)
            try:
                answer = mask(r.json())
            except ValueError:
                answer = r.text
            out.append(
                {
                    "request": [method, path, body],
                    "status": r.status_code,
                    "type": r.headers.get("content-type"),
                    "retry_after": r.headers.get("retry-after"),
                    "body": answer,
                }
            )
        metrics = client.get("/metrics").text
    names = {line.split(" ")[0] for line in metrics.splitlines() if line[:1] not in ("", "#")}
    out.append({"metrics": sorted(n for n in names if "_created" not in n)})
    return out


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per difference."""
    problems = []
    if before["openapi"] != after["openapi"]:
        problems.append("/openapi.json differs")
    for name in sorted(set(before["help"]) | set(after["help"])):
        if before["help"].get(name) != after["help"].get(name):
            problems.append(f"`cisrank {name} --help` differs")
    for old, new in zip(before["answers"], after["answers"], strict=True):
        if old != new:
            what = old.get("request", "metrics")
            problems.append(f"{what}: {json.dumps(old)[:300]} -> {json.dumps(new)[:300]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, help="write the contract here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(p.read_text(encoding="utf-8")) for p in args.compare)
        problems = compare(before, after)
        print(
            "\n".join(problems)
            or f"the same: {len(before['answers']) - 1} answers, "
            f"{len(before['help'])} help texts, /openapi.json"
        )
        return 1 if problems else 0
    if args.out is None:
        parser.error("give OUT or --compare BEFORE AFTER")
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CISRANK_LM_BACKEND": "torch"}
    env |= {"CISRANK_CPU_BF16": "0", "CISRANK_ENCODER_BACKEND": "torch", "CISRANK_AUTO_PULL": "0"}
    os.environ.update(env)
    contract = {"openapi": openapi(), "help": help_texts(), "answers": answers()}
    args.out.write_text(json.dumps(contract, indent=1, sort_keys=True), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
