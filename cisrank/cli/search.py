"""`cisrank search`: one query (`--query`) or a topics file (`--queries topics.tsv --output run.trec`)
against one index, or several fused by reciprocal-rank fusion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cisrank.cli.defaults import config_flag
from cisrank.retrieval.fusion import FusionConfig


def search(
    index: Annotated[
        list[Path],
        typer.Option("--index", "-i", help="Index folder; repeat to fuse several."),
    ],
    query: Annotated[str | None, typer.Option("--query", help="One query.")] = None,
    queries: Annotated[
        Path | None, typer.Option("--queries", help="Topics file: qid<TAB>query per line.")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="TREC run file to write (with --queries)."),
    ] = None,
    k: Annotated[
        int,
        typer.Option(
            "--top-n", "--top-k", "-k", min=1, help="Hits per query (--top-k, -k: aliases)."
        ),
    ] = 10,
    fusion: Annotated[
        str, typer.Option("--fusion", help="How to combine several indexes: rrf.")
    ] = "rrf",
    rrf_k: Annotated[float | None, config_flag(FusionConfig, "k", "--rrf-k")] = None,
    depth: Annotated[int | None, config_flag(FusionConfig, "depth", "--depth")] = None,
    tag: Annotated[str | None, typer.Option("--tag", help="Run tag in the TREC file.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="For dense indexes.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Retrieve from built indexes: print hits for --query, or write a TREC run for --queries."""
    from cisrank.cli.tables import print_ranking
    from cisrank.data.datasets import read_topics
    from cisrank.data.runs import Run
    from cisrank.errors import CisrankError
    from cisrank.indexes.first_stage import open_retriever, retrieve_candidates

    if (query is None) == (queries is None):
        raise CisrankError("give exactly one of --query TEXT or --queries topics.tsv")
    if fusion != "rrf":
        raise CisrankError(f"unknown fusion '{fusion}': rrf")
    if query is not None and not query.strip():
        raise CisrankError("--query is empty")
    if queries is not None and output is None:
        raise CisrankError("--queries needs --output run.trec")
    if queries is not None and not queries.is_file():
        raise CisrankError(f"queries file '{queries}' does not exist")
    options = {"device": device} if device else {}
    retriever = open_retriever(index, fusion_k=rrf_k, depth=depth, **options)
    if queries is not None:
        assert output is not None  # checked above
        topics = read_topics(queries)
        cands = retrieve_candidates(retriever, topics, k)
        run = Run.from_scores(
            retriever.name, {q: [(h.docid, h.score) for h in hits] for q, hits in cands.items()}
        )
        run.write_trec(output, tag=tag or f"cisrank-{retriever.name}")
        empty = sum(1 for hits in cands.values() if not hits)
        msg = f"wrote {output}: {len(topics)} queries, top {k} from {retriever.name}"
        typer.echo(msg + (f" ({empty} with no hits)" if empty else ""), err=as_json)
        return
    assert query is not None  # exactly one of --query and --queries, checked above
    hits = retriever.search(query, k)
    if as_json:
        rows = [
            {"rank": r, "docid": h.docid, "score": h.score, "text": h.text}
            for r, h in enumerate(hits, 1)
        ]
        typer.echo(
            json.dumps({"query": query, "retriever": retriever.name, "hits": rows}, indent=2)
        )
        return
    print_ranking(
        f"{retriever.name}: {query}", "docid", "text", ((h.docid, h.score, h.text) for h in hits)
    )
