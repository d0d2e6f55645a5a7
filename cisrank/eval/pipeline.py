"""Rerank a dataset's first-stage candidates and evaluate both runs side by side."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from cisrank.data.runs import Run
from cisrank.data.types import Dataset
from cisrank.eval import metrics as M
from cisrank.eval.coverage import judged_to_evaluate
from cisrank.eval.report import plot_deltas, write_metrics_json, write_per_query_tsv
from cisrank.rerank.base import Reranker
from cisrank.version import __version__

log = logging.getLogger(__name__)

FIRST_STAGE = "first-stage"
RERANKED = "reranked"
KEY_MEASURE = "nDCG@10"
# Queries per `score_batch` call: enough for a cross-query batching reranker to fill its model
# batches at depth 100, few enough that the progress bar moves.
QUERIES_PER_CALL = 8


@dataclass
class EvalResult:
    dataset: str
    runs: dict[str, Run]
    metrics: dict[str, dict[str, float]]
    per_query: dict[str, M.PerQuery]
    significance: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dataset": self.dataset, "runs": self.metrics}
        if self.significance is not None:
            out["significance"] = {f"{RERANKED} vs {FIRST_STAGE}": self.significance}
        out.update(self.info)
        return out


def first_stage_run(dataset: Dataset) -> Run:
    return Run.from_scores(
        FIRST_STAGE,
        {qid: [(h.docid, h.score) for h in dataset.candidates[qid]] for qid in dataset.qids},
    )


def rerank_run(
    dataset: Dataset,
    reranker: Reranker,
    depth: int = 100,
    progress: bool = True,
    queries_per_call: int = QUERIES_PER_CALL,
) -> tuple[Run, dict[str, float]]:
    """Rerank the top `depth` candidates of every query; candidates below keep their order.

    Queries go to `score_batch` `queries_per_call` at a time, so a reranker that batches across
    queries fills its model batches; scores do not depend on the grouping. Those below `depth`
    get scores under the lowest reranked score (minus 1, 2, ...) so that the run stays one
    strictly decreasing list and recall at 100 still counts them.
    """
    if queries_per_call < 1:
        raise ValueError(f"queries_per_call must be >= 1, got {queries_per_call}")
    scores: dict[str, list[tuple[str, float]]] = {}
    passages = 0
    started = time.perf_counter()
    qids = dataset.qids
    with tqdm(
        total=len(qids), desc=f"rerank ({reranker.name})", unit="query", disable=not progress
    ) as bar:
        for at in range(0, len(qids), queries_per_call):
            chunk = qids[at : at + queries_per_call]
            heads = [dataset.candidates[qid][:depth] for qid in chunk]
            requests = [
                (dataset.topics[qid], [h.text for h in head])
                for qid, head in zip(chunk, heads, strict=True)
            ]
            batch = reranker.score_batch(requests)
            if len(batch) != len(chunk):
                raise RuntimeError(
                    f"{reranker!r} returned {len(batch)} score lists for {len(chunk)} queries"
                )
            for qid, head, values in zip(chunk, heads, batch, strict=True):
                if len(values) != len(head):
                    raise RuntimeError(
                        f"{reranker!r} returned {len(values)} scores for {len(head)} passages"
                    )
                entries = [(h.docid, float(v)) for h, v in zip(head, values, strict=True)]
                floor = min(values) if values else 0.0
                tail = dataset.candidates[qid][depth:]
                entries += [(h.docid, floor - i) for i, h in enumerate(tail, 1)]
                scores[qid] = entries
                passages += len(head)
            bar.update(len(chunk))
    elapsed = time.perf_counter() - started
    timing = {
        "seconds": elapsed,
        "passages": passages,
        "passages_per_s": passages / max(elapsed, 1e-9),
    }
    return Run.from_scores(RERANKED, scores), timing


def run_eval(
    dataset: Dataset,
    reranker: Reranker,
    *,
    depth: int = 100,
    output: Path | None = None,
    measures: tuple[str, ...] = M.DEFAULT_MEASURES,
    progress: bool = True,
    queries_per_call: int = QUERIES_PER_CALL,
    missing: str = "refuse",
) -> EvalResult:
    """Evaluate the first stage and, unless the reranker keeps the input order (`none`), the
    reranked run against it; a reranker that keeps the order would only restate the first stage,
    so the first-stage run with its own scores is the result.

    Judged queries that cannot be run (no topic or no candidates) refuse the evaluation before
    any reranking unless `missing` says to count them 0 (`zero`) or leave them out (`skip`):
    `cisrank.eval.coverage`."""
    if depth < 1:
        raise ValueError("depth must be >= 1")
    qrels, coverage = judged_to_evaluate(dataset, missing)
    runs = {FIRST_STAGE: first_stage_run(dataset)}
    reranks = not reranker.keeps_order
    info: dict[str, Any] = {
        "cisrank_version": __version__,
        "source": dataset.source,
        "queries_judged": coverage["judged"],
        "queries_run": len(dataset.qids),
        "queries_evaluated": len(qrels),
        "depth": depth,
        "reranker": {
            "name": reranker.name,
            "model": reranker.model_name,
            "runtime": reranker.runtime,
            "compute_type": reranker.compute_type,
        }
        if reranks
        else None,
    }
    if "missing" in coverage:
        info["judged_not_run"] = {k: coverage[k] for k in ("missing", "no_topic", "no_candidates")}
    if dataset.notes:
        info["notes"] = dataset.notes
    if reranks:
        runs[RERANKED], info["timing"] = rerank_run(
            dataset, reranker, depth, progress, queries_per_call
        )
    per_query = {name: M.per_query(run, qrels, measures) for name, run in runs.items()}
    result = EvalResult(
        dataset.name,
        runs,
        {name: M.mean(pq) for name, pq in per_query.items()},
        per_query,
        info=info,
    )
    if reranks:
        result.significance = {
            "measure": KEY_MEASURE,
            **M.paired_test(per_query[FIRST_STAGE][KEY_MEASURE], per_query[RERANKED][KEY_MEASURE]),
        }
    if output is not None:
        write_outputs(result, dataset, Path(output))
    return result


def write_outputs(result: EvalResult, dataset: Dataset, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    final = RERANKED if RERANKED in result.runs else FIRST_STAGE
    tag = (
        f"cisrank-{result.info['reranker']['name']}" if final == RERANKED else "cisrank-first-stage"
    )
    result.runs[final].write_trec(output / "run.trec", tag=tag)
    if final == RERANKED:
        result.runs[FIRST_STAGE].write_trec(output / "first-stage.trec", tag="first-stage")
    write_per_query_tsv(output / "per_query.tsv", result.per_query, dataset.topics)
    if final == RERANKED:
        plot_deltas(
            output / f"delta_{KEY_MEASURE.replace('@', '_at_')}.png",
            result.per_query[FIRST_STAGE][KEY_MEASURE],
            result.per_query[RERANKED][KEY_MEASURE],
            KEY_MEASURE,
            f"{result.dataset}: {result.info['reranker']['name']} reranking vs first stage",
        )
    write_metrics_json(output / "metrics.json", result.to_json())
    log.info("wrote %s", output)
