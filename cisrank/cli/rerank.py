"""`cisrank rerank`: rank a file of passages for one query with any reranker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from cisrank.cli.options import (
    RERANKER_KINDS,
    WORKER_FLAGS,
    BatchOpt,
    DeviceOpt,
    JsonOpt,
    ModelOpt,
    PassageRerankerOpt,
    takes,
)
from cisrank.cli.reranker_flags import reranker_flags
from cisrank.cli.tables import print_ranking
from cisrank.errors import CisrankError
from cisrank.jobs.pool import WorkerOptions


def _read_passages(path: Path) -> tuple[list[str], list[str]]:
    """jsonl with `text` (and optional `id`, `title`, `score`), or one passage per line: the one
    reader `cisrank context` uses too."""
    from cisrank.context.passages import read_passages

    passages = read_passages(path)
    return [p.text for p in passages], [p.docid for p in passages]


@reranker_flags()
@takes(pool=WORKER_FLAGS)
def rerank(
    query: Annotated[str, typer.Option("--query", help="The query.")],
    passages: Annotated[
        Path,
        typer.Option(
            "--passages", help="jsonl with 'text' and optional 'id', or one passage per line."
        ),
    ],
    reranker: PassageRerankerOpt = "student",
    model: ModelOpt = None,
    top_n: Annotated[
        int | None,
        typer.Option(
            "--top-n", "--top-k", "-k", min=1, help="Show only the best N (--top-k, -k: aliases)."
        ),
    ] = None,
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    as_json: JsonOpt = False,
    *,
    pool: WorkerOptions,
    **options: Any,
) -> None:
    """Rank passages for one query, most relevant first."""
    from cisrank.rerank.registry import RerankerSpec

    spec = RerankerSpec.of(reranker, model, batch_size=batch_size, device=device, **options)
    if spec.keeps_order:
        raise CisrankError(f"`rerank` needs a reranker: --reranker {RERANKER_KINDS}")
    if not query.strip():
        raise CisrankError("--query is empty")
    texts, ids = _read_passages(passages)
    # workers only once they pay for their start: three passages are scored here
    model_obj = spec.build(pool, expected_chars=sum(len(query) + len(t) for t in texts))
    try:
        ranked = model_obj.rank(query, texts, top_n=top_n)
    finally:
        model_obj.close()
    if as_json:
        rows = [
            {"rank": r, "index": p.index, "id": ids[p.index], "score": p.score, "text": p.text}
            for r, p in enumerate(ranked, 1)
        ]
        typer.echo(
            json.dumps(
                {
                    "query": query,
                    "reranker": reranker,
                    "model": model_obj.model_name,
                    "results": rows,
                },
                indent=2,
            )
        )
        return
    print_ranking(
        f"{reranker} ({model_obj.model_name}): {query}",
        "id",
        "passage",
        ((ids[p.index], p.score, p.text) for p in ranked),
    )
