"""nDCG@10 of truncation against max and mean pooling on long documents, and what each costs.

Why: a reranker that reads a long document up to its model's window ranks it by its start; the
server now cuts it into windows and scores it by its best (`cisrank.rerank.chunking`). This
measures on a padded TREC DL set (`bench/long_docs.py`: every candidate padded to 1,000-5,000
words, the judged text at the start, middle or end) how much that finds and what it costs.

Every window of a query's top `--depth` candidates is scored once, as the server plans them
(`plan_request`, the model's own window and `--overlap`), then pooled three ways from the same
scores: `first` (the first window alone: the truncation a reranker did before, less the
characters past the window's last token), `max` and `mean`. The cost of `first` is also timed
on its own, in the same process after the windows, so the cost ratio is one run's. The dense
reranker's passage cache is off: with it, the first windows timed after every window had been
scored were cache hits, and the ratio was not what scoring costs (`--retime N` times the first N
queries' windows and first windows again, uncached, for a log written before).

Resumable: each query's window scores are appended to `--out`.jsonl as it finishes (a line is
written whole or not at all: an interrupted line is dropped on reading) and a rerun scores only
the queries missing; the summary goes to `--out`.json.

    python bench/long_docs.py trec-dl21 out/long-dl21-end --position end
    python bench/long_docs_eval.py out/long-dl21-end --reranker student --out out/student-end
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from cisrank.data.datasets import load_folder
from cisrank.data.runs import Run
from cisrank.eval.metrics import per_query
from cisrank.rerank.chunking import Chunking, ChunkPlan, Splitter, plan_request, pool
from cisrank.rerank.registry import load_reranker

POOLINGS = ("first", "max", "mean")
MEASURES = ("nDCG@10", "R(rel=2)@100")
CUT = ("docids", "scores", "spans")
"""A log row's per-document fields, in first-stage order."""


def done_queries(path: Path) -> dict[str, dict[str, Any]]:
    """The queries already scored in the log at `path`, by qid (a torn last line is skipped)."""
    out: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[row["qid"]] = row
    return out


def score_query(reranker: Any, splitter: Splitter, query: str, texts: list[str], overlap: int):
    """Per document, its window scores, in the order `pool` reads them, and the seconds."""
    chunking = Chunking(overlap_tokens=overlap)
    plan = plan_request(splitter, reranker.passage_window, query, texts, chunking)
    started = time.perf_counter()
    scores = reranker.score(query, plan.texts(texts))
    seconds = time.perf_counter() - started
    per_doc, at = [], 0
    for spans in plan.spans:
        per_doc.append([float(s) for s in scores[at : at + len(spans)]])
        at += len(spans)
    return per_doc, [[list(s) for s in spans] for spans in plan.spans], seconds


def pooled_run(rows: dict[str, dict[str, Any]], pooling: str) -> Run:
    scores = {}
    for qid, row in rows.items():
        plan = ChunkPlan([[tuple(s) for s in spans] for spans in row["spans"]], [])
        flat = [s for doc in row["scores"] for s in doc]
        values = [score for score, _ in pool(plan, flat, pooling)]  # type: ignore[arg-type]
        scores[qid] = list(zip(row["docids"], values, strict=True))
    return Run.from_scores(pooling, scores)


def first_only_seconds(
    reranker: Any, ds: Any, depth: int, splitter: Splitter, qids: list[str] | None = None
) -> float:
    """Seconds to score every query's (or `qids`') candidates by their first window alone."""
    chunking = Chunking(pooling="first")
    total = 0.0
    for qid in ds.qids if qids is None else qids:
        texts = [h.text for h in ds.candidates[qid][:depth]]
        plan = plan_request(splitter, reranker.passage_window, ds.topics[qid], texts, chunking)
        started = time.perf_counter()
        reranker.score(ds.topics[qid], plan.texts(texts))
        total += time.perf_counter() - started
    return total


def retime(reranker: Any, ds: Any, args: argparse.Namespace, splitter: Splitter) -> dict:
    """Seconds of every window and of the first windows of the set's first `args.retime`
    queries, timed one after the other in this process (the cost ratio of a log whose own
    timings are not comparable)."""
    qids = ds.qids[: args.retime]
    windows = 0.0
    for qid in qids:
        texts = [h.text for h in ds.candidates[qid][: args.depth]]
        windows += score_query(reranker, splitter, ds.topics[qid], texts, args.overlap)[2]
    first = first_only_seconds(reranker, ds, args.depth, splitter, qids)
    return {
        "queries": len(qids),
        "windows_seconds": windows,
        "first_seconds": first,
        "ratio": windows / first,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="a padded dataset folder (bench/long_docs.py)")
    ap.add_argument("--reranker", default="student")
    ap.add_argument("--model", default=None)
    ap.add_argument("--backend", default=None, help="the reranker's runtime (torch, onnx, auto)")
    ap.add_argument("--dtype", default=None, help="its compute type (float32, int8, bfloat16)")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--overlap", type=int, default=32, help="tokens consecutive windows share")
    ap.add_argument("--out", type=Path, required=True, help="path stem of the .jsonl and .json")
    ap.add_argument("--no-first-timing", action="store_true")
    ap.add_argument(
        "--limit", type=int, default=None, help="the set's first N queries only (a cheaper run)"
    )
    ap.add_argument(
        "--retime",
        type=int,
        default=None,
        metavar="N",
        help="time every window and the first windows of the first N queries again (scores "
        "not kept), into the summary's `retime`",
    )
    args = ap.parse_args()
    ds = load_folder(args.data)
    if args.limit is not None:
        keep = set(ds.qids[: args.limit])
        ds.topics = {q: t for q, t in ds.topics.items() if q in keep}
        ds.qrels = {q: j for q, j in ds.qrels.items() if q in keep}
    options: dict[str, Any] = {"backend": args.backend, "dtype": args.dtype}
    if args.reranker == "dense":
        options["passage_cache_mb"] = 0  # costs are compute, not cache hits (module docstring)
    reranker = load_reranker(args.reranker, args.model, **options)
    window = reranker.passage_window
    splitter = Splitter(window.tokenizer if window is not None else None)
    log = args.out.with_suffix(".jsonl")
    log.parent.mkdir(parents=True, exist_ok=True)
    rows = done_queries(log)
    for n, qid in enumerate(ds.qids, 1):
        if qid in rows:
            continue
        head = ds.candidates[qid][: args.depth]
        texts = [h.text for h in head]
        scores, spans, seconds = score_query(
            reranker, splitter, ds.topics[qid], texts, args.overlap
        )
        row = {
            "qid": qid,
            "docids": [h.docid for h in head],
            "scores": scores,
            "spans": spans,
            "seconds": seconds,
        }
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        rows[qid] = row
        print(f"{n}/{len(ds.qids)} {qid}: {sum(map(len, scores))} windows, {seconds:.1f} s")
    # a log scored deeper serves a shallower summary: a query's first `depth` documents are
    # scored as they would be alone (a window's score depends on its text, not its company)
    cut = any(len(rows[q]["docids"]) > args.depth for q in ds.qids)
    rows = {q: {**rows[q], **{k: rows[q][k][: args.depth] for k in CUT}} for q in ds.qids}
    summary: dict[str, Any] = {
        "data": str(args.data),
        "reranker": args.reranker,
        "model": reranker.model_name,
        "backend": args.backend,
        "dtype": args.dtype,
        "depth": args.depth,
        "limit": args.limit,
        "overlap": args.overlap,
        "window": None if window is None else window.tokens,
        "queries": len(rows),
        "documents": sum(len(r["docids"]) for r in rows.values()),
        "windows": sum(len(s) for r in rows.values() for s in r["scores"]),
        # a cut log's seconds are its deeper lists': not this depth's cost
        "windows_seconds": None if cut else sum(r["seconds"] for r in rows.values()),
        "pooling": {},
    }
    for pooling in POOLINGS:
        values = per_query(pooled_run(rows, pooling), ds.qrels, MEASURES)
        summary["pooling"][pooling] = {
            m: sum(v.values()) / max(len(v), 1) for m, v in values.items()
        }
        summary["pooling"][pooling]["per_query_ndcg10"] = values["nDCG@10"]
    if not args.no_first_timing:
        summary["first_seconds"] = first_only_seconds(reranker, ds, args.depth, splitter)
    if args.retime:
        summary["retime"] = retime(reranker, ds, args, splitter)
    tmp = args.out.with_suffix(".json.partial")
    tmp.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    tmp.replace(args.out.with_suffix(".json"))
    brief = {p: round(v["nDCG@10"], 4) for p, v in summary["pooling"].items()}
    print(json.dumps({k: summary[k] for k in ("windows", "windows_seconds", "documents")}), brief)


if __name__ == "__main__":
    main()
