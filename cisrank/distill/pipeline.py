"""`distill run`: teacher rows -> student -> evaluation, for the common case in one command.

Each stage writes into its own subfolder of `out` and is skipped when already complete, so an
interrupted run picks up where it stopped (teacher shards and training checkpoints included).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from cisrank.data.datasets import guarded_json, load_named
from cisrank.distill import rows as R
from cisrank.distill.config import RunPlan, TrainConfig
from cisrank.distill.evaluate import Scores, spearman_to_teacher
from cisrank.distill.generate import generate
from cisrank.distill.sources import PairSource, from_dataset, from_triples
from cisrank.distill.teachers import Teacher
from cisrank.distill.train import TRAINING_FILE, student_kind, train
from cisrank.eval.pipeline import KEY_MEASURE, run_eval
from cisrank.fileio import atomic_write_text
from cisrank.rerank.registry import load_reranker

log = logging.getLogger(__name__)
SUMMARY_FILE = "summary.json"


def teacher_scores(folder: Path) -> Scores:
    table = R.read_rows(folder).select(["qid", "docid", "score"]).to_pydict()
    out: Scores = {}
    for q, d, s in zip(table["qid"], table["docid"], table["score"], strict=True):
        out.setdefault(q, {})[d] = s
    return out


def distill_run(
    plan: RunPlan,
    teacher: Teacher,
    config: TrainConfig,
    out: str | Path,
    *,
    device: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    out = Path(out)
    timings: dict[str, float] = {}
    started = time.perf_counter()

    sources: list[PairSource] = [
        from_dataset(load_named(n, require_qrels=False), plan.depth) for n in plan.train_datasets
    ]
    if plan.triples is not None:
        sources.append(from_triples(plan.triples))
    eval_ds = load_named(plan.eval_dataset)
    folders = []
    t = time.perf_counter()
    for src in sources:
        folder = out / "teacher" / src.name
        generate(src, teacher, folder, progress=progress)
        folders.append(folder)
    eval_rows = out / "teacher" / f"{eval_ds.name}-eval"
    generate(from_dataset(eval_ds, plan.eval_depth), teacher, eval_rows, progress=progress)
    timings["generate_s"] = time.perf_counter() - t

    student = out / "student"
    t = time.perf_counter()
    if (student / TRAINING_FILE).is_file():
        log.info("%s: already trained", student)
        record = guarded_json(
            (student / TRAINING_FILE).read_text(encoding="utf-8"), str(student / TRAINING_FILE)
        )
    else:
        dev = load_named(config.dev_dataset) if config.dev_dataset else None
        record = train(folders, student, config, dev, resume=True, device=device)
    timings["train_s"] = time.perf_counter() - t

    t = time.perf_counter()
    reranker = load_reranker(student_kind(config), str(student), device=device)
    result = run_eval(
        eval_ds, reranker, depth=plan.eval_depth, output=out / "eval", progress=progress
    )
    # The evaluated run itself (ties, if any, split by one float32 step as in every run).
    agreement = spearman_to_teacher(result.runs["reranked"].as_dict(), teacher_scores(eval_rows))
    timings["eval_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - started

    summary = {
        "eval_dataset": eval_ds.name,
        "student": str(student),
        "teacher": teacher.describe(),
        KEY_MEASURE: {
            "first_stage": result.metrics["first-stage"][KEY_MEASURE],
            "student": result.metrics["reranked"][KEY_MEASURE],
        },
        "spearman_to_teacher": agreement,
        "best_dev": record.get("best_dev_metric"),
        "train_config": record.get("config"),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }
    atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return summary
