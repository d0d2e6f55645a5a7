"""Rerank a dataset's first-stage candidates and evaluate both runs side by side."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from cisrank import __version__
from cisrank.data.runs import Run
from cisrank.data.types import Dataset
from cisrank.eval import metrics as M
from cisrank.eval.report import plot_deltas, write_metrics_json, write_per_query_tsv
from cisrank.rerank.base import Reranker

log = logging.getLogger(__name__)

FIRST_STAGE = "first-stage"
RERANKED = "reranked"
KEY_MEASURE = "nDCG@10"


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
    dataset: Dataset, reranker: Reranker, depth: int = 100, progress: bool = True
) -> tuple[Run, dict[str, float]]:
    """Rerank the top `depth` candidates of every query; candidates below keep their order.

    Those below `depth` get scores under the lowest reranked score (minus 1, 2, ...) so that the
    run stays one strictly decreasing list and recall at 100 still counts them.
    """
    scores: dict[str, list[tuple[str, float]]] = {}
    passages = 0
    started = time.perf_counter()
    for qid in tqdm(
        dataset.qids, desc=f"rerank ({reranker.name})", unit="query", disable=not progress
    ):
        hits = dataset.candidates[qid]
        head, tail = hits[:depth], hits[depth:]
        values = reranker.score(dataset.topics[qid], [h.text for h in head])
        if len(values) != len(head):
            raise RuntimeError(
                f"{reranker!r} returned {len(values)} scores for {len(head)} passages"
            )
        entries = [(h.docid, float(v)) for h, v in zip(head, values, strict=True)]
        floor = min(values) if values else 0.0
        entries += [(h.docid, floor - i) for i, h in enumerate(tail, 1)]
        scores[qid] = entries
        passages += len(head)
    elapsed = time.perf_counter() - started
    timing = {
        "seconds": elapsed,
        "passages": passages,
        "passages_per_s": passages / max(elapsed, 1e-9),
    }
    return Run.from_scores(RERANKED, scores), timing


def run_eval(
    dataset: Dataset,
    reranker: Reranker | None,
    *,
    depth: int = 100,
    output: Path | None = None,
    measures: tuple[str, ...] = M.DEFAULT_MEASURES,
    progress: bool = True,
) -> EvalResult:
    if depth < 1:
        raise ValueError("depth must be >= 1")
    runs = {FIRST_STAGE: first_stage_run(dataset)}
    info: dict[str, Any] = {
        "cisrank_version": __version__,
        "source": dataset.source,
        "queries_judged": sum(1 for q in dataset.qrels.values() if q),
        "queries_run": len(dataset.qids),
        "depth": depth,
        "reranker": None
        if reranker is None
        else {"name": reranker.name, "model": reranker.model_name},
    }
    if dataset.notes:
        info["notes"] = dataset.notes
    if reranker is not None:
        runs[RERANKED], info["timing"] = rerank_run(dataset, reranker, depth, progress)
    per_query = {name: M.per_query(run, dataset.qrels, measures) for name, run in runs.items()}
    result = EvalResult(
        dataset.name,
        runs,
        {name: M.mean(pq) for name, pq in per_query.items()},
        per_query,
        info=info,
    )
    if reranker is not None:
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
