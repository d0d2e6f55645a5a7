"""`cisrank rerank`: rank a file of passages for one query with any reranker."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from cisrank.cli.options import (
    CHUNK_FLAGS,
    RERANKER_KINDS,
    WORKER_FLAGS,
    BatchOpt,
    ChunkChanges,
    DeviceOpt,
    JsonOpt,
    ModelOpt,
    PassageRerankerOpt,
    takes,
)
from cisrank.cli.reranker_flags import reranker_flags
from cisrank.cli.tables import print_ranking
from cisrank.data.types import BestChunk, RankedPassage
from cisrank.errors import CisrankError
from cisrank.jobs.pool import WorkerOptions


def _read_passages(path: Path) -> tuple[list[str], list[str]]:
    """jsonl with `text` (and optional `id`, `title`, `score`), or one passage per line: the one
    reader `cisrank context` uses too."""
    from cisrank.context.passages import read_passages

    passages = read_passages(path)
    return [p.text for p in passages], [p.docid for p in passages]


@reranker_flags()
@takes(pool=WORKER_FLAGS, chunking=CHUNK_FLAGS)
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
    chunking: ChunkChanges,
    **options: Any,
) -> None:
    """Rank passages for one query, most relevant first. A passage longer than the model's
    window is cut into windows (--chunk-window-tokens, --chunk-overlap-tokens) and scored by
    its best (--chunk-pooling max; mean, and first, the truncation, for comparison), as
    `cisrank serve` ranks it; the best window and the windows scored are shown."""
    from cisrank.rerank.chunking import Chunking
    from cisrank.rerank.registry import RerankerSpec

    spec = RerankerSpec.of(reranker, model, batch_size=batch_size, device=device, **options)
    if spec.keeps_order:
        raise CisrankError(f"`rerank` needs a reranker: --reranker {RERANKER_KINDS}")
    if not query.strip():
        raise CisrankError("--query is empty")
    texts, ids = _read_passages(passages)
    chunks = chunking.over(Chunking())
    # workers only once they pay for their start: three passages are scored here
    model_obj = spec.build(pool, expected_chars=sum(len(query) + len(t) for t in texts))
    try:
        ranked = model_obj.rank(query, texts, top_n=top_n, chunking=chunks)
    finally:
        model_obj.close()
    if as_json:
        rows = [
            {
                "rank": r,
                "index": p.index,
                "id": ids[p.index],
                "score": p.score,
                "text": p.text,
                "best_chunk": _span(p.best_chunk),
            }
            for r, p in enumerate(ranked, 1)
        ]
        usage = asdict(ranked.chunks) if ranked.chunks is not None else None
        typer.echo(
            json.dumps(
                {
                    "query": query,
                    "reranker": reranker,
                    "model": model_obj.model_name,
                    "results": rows,
                    "chunks": usage,
                },
                indent=2,
            )
        )
        return
    print_ranking(
        f"{reranker} ({model_obj.model_name}): {query}",
        "id",
        "passage (its best window where it was cut)",
        ((ids[p.index], p.score, _best_text(p)) for p in ranked),
    )
    if ranked.chunks is not None and ranked.chunks.chunked_documents:
        c = ranked.chunks
        typer.echo(
            f"{c.chunked_documents} passages longer than the model's window: {c.windows_scored} "
            f"windows scored, {c.windows_dropped} left out"
        )


def _span(chunk: BestChunk | None) -> dict[str, Any] | None:
    return None if chunk is None else {"start": chunk.start, "end": chunk.end, "score": chunk.score}


def _best_text(p: RankedPassage) -> str:
    """The passage, or its best window where it was cut into several."""
    chunk = p.best_chunk
    if chunk is None or (chunk.start, chunk.end) == (0, len(p.text)):
        return p.text
    return p.text[chunk.start : chunk.end]
