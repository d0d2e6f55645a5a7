"""The serving engine is usable without the web: plain queries in, plain results out, and neither
FastAPI nor Starlette imported (the import-linter contracts check the imports, this checks what a
program that embeds the engine actually loads)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from cisrank.rerank.base import BaseReranker
    from cisrank.serving import (
        EmbedQuery, Metrics, RankingService, RerankQuery, ServerConfig, Serving, ServiceError,
    )
    from cisrank.serving.config import RerankerSpec

    def overlap(q, p):
        return float(len(set(q.split()) & set(p.split())))

    class Overlap(BaseReranker):
        name = "overlap"
        model_name = "overlap-v1"

        def score_batch(self, requests):
            return [[overlap(q, p) for p in ps] for q, ps in requests]

    async def main():
        spec = RerankerSpec(kind="dense", model="overlap-v1")
        config = ServerConfig(rerankers={"o": spec}, normalize="minmax")
        serving = Serving(config, Metrics(), rerankers={"o": Overlap()})
        service = RankingService(serving)
        docs = ["a b c", "b", "x y", "a b"]
        ranked = await service.rerank(RerankQuery(query="a b c", documents=docs, top_n=3))
        try:
            await service.embed(EmbedQuery(texts=["a"]))
        except ServiceError as exc:
            error = [type(exc).__name__, exc.field]
        await serving.aclose()
        print(json.dumps({
            "reranker": ranked.reranker,
            "results": [[r.index, r.score] for r in ranked.results],
            "documents": ranked.documents,
            "error": error,
            "web": sorted(m for m in sys.modules if m.split(".")[0] in ("fastapi", "starlette")),
        }))

    asyncio.run(main())
    """
)


def test_an_embedded_engine_ranks_without_the_web():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    # overlaps 3, 1, 0, 2: best first, top 3, min-max over the request's four scores
    assert out["results"] == [[0, 1.0], [3, 2 / 3], [1, 1 / 3]]
    assert out["reranker"] == "o" and out["documents"] == 4
    assert out["error"] == ["InvalidField", "model"]  # no bi-encoder to embed with
    assert out["web"] == []
