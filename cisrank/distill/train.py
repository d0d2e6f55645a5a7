"""`distill train`: fit a sentence-transformers CrossEncoder to teacher scores.

The student regresses the teacher's raw scores (`mse`, identity activation), the margins between
two passages of one query (`margin-mse`) or each query's distribution (`listwise`): the losses of
`cisrank.distill.losses`, picked by `TrainConfig.loss`, each saying what examples it trains on,
its sentence-transformers loss and its batch sampler. With `normalize="query"` each query's
labels are standardized first: rerankers only need the order within a query, and CIS or cosine
scores carry a per-query offset that a regression would otherwise spend capacity on.

The best checkpoint by dev nDCG@10 is kept (trainer `load_best_model_at_end`), the learning curve
is written next to the model, and the output folder loads with `CrossEncoder(path)`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cisrank.data.types import Dataset
from cisrank.distill import rows as R
from cisrank.distill.config import TrainConfig
from cisrank.distill.evaluate import ndcg10, score_dataset
from cisrank.distill.losses import Query, load_loss
from cisrank.errors import DataError, ModelNotFoundError, require
from cisrank.fileio import atomic_write_text
from cisrank.models.resolve import resolve_model
from cisrank.rerank.base import BaseReranker, Request
from cisrank.rerank.registry import CROSS_ENCODER, DENSE
from cisrank.version import __version__

log = logging.getLogger(__name__)

TRAINING_FILE = "distill-training.json"
CURVE_FILE = "learning_curve.tsv"


def student_kind(config: TrainConfig) -> str:
    """The reranker kind that serves a student trained with `config`: a cross-encoder's one
    logit, or a bi-encoder's cosine (the dense kind, whose passage embeddings can be cached)."""
    return DENSE.name if config.student == "bi" else CROSS_ENCODER.name


def load_teacher_rows(folders: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Per query (namespaced by folder, so equal qids of two sources never merge): its text,
    passages, first-stage ranks and teacher scores, in first-stage order."""
    queries: dict[str, dict[str, Any]] = {}
    for n, folder in enumerate(folders):
        table = R.read_rows(folder).select(["qid", "query", "passage", "rank", "score"])
        rows = table.to_pydict()
        for qid, query, passage, rank, score in zip(
            rows["qid"], rows["query"], rows["passage"], rows["rank"], rows["score"], strict=True
        ):
            q = queries.setdefault(
                f"{n}:{qid}", {"query": query, "passages": [], "ranks": [], "scores": []}
            )
            q["passages"].append(passage)
            q["ranks"].append(int(rank))
            q["scores"].append(float(score))
    out = [_by_rank(q) for q in queries.values()]
    for n, folder in enumerate(folders):
        mine = [q for key, q in zip(queries, out, strict=True) if key.startswith(f"{n}:")]
        refuse_degenerate(f"teacher rows '{folder}'", {"score": [q["scores"] for q in mine]})
    return out


def load_teacher_sets(
    paths: Sequence[str | Path],
    fuse_spec: str | None = None,
    fusion: str = "zscore",
    pool: str | Path | None = None,
    seed: int = 12,
) -> list[dict[str, Any]]:
    """Per query of committed teacher sets (`distill.teacher_set`): text joined back by id, and
    labels fused from the named components (per-query normalized, weighted sum; the first
    component alone when `fuse_spec` is None). A path `PATH@N` takes N of the set's queries,
    drawn by `seed` (nested across N: a learning curve's slices of one set)."""
    from cisrank.distill import teacher_set as TS
    from cisrank.fusion import fuse, parse_weights

    queries: list[dict[str, Any]] = []
    for spec in paths:
        path, count = TS.parse_set_spec(spec)
        ts = TS.load(path)
        if count is not None:
            ts = ts.sample(count, seed)
        weights = parse_weights(fuse_spec) if fuse_spec else {ts.components[0]: 1.0}
        unknown = sorted(set(weights) - set(ts.components))
        if unknown:
            raise DataError(
                f"teacher set '{path}' has no component {', '.join(unknown)} "
                f"(it has {', '.join(ts.components)})"
            )
        attached = TS.attach_text(ts, TS.texts_of(ts, pool), list(weights))
        refuse_degenerate(
            f"teacher set '{path}'",
            {name: [q["components"][name] for q in attached] for name in weights},
        )
        for q in attached:
            parts = [q["components"][name] for name in weights]
            labels = (
                parts[0]
                if len(parts) == 1
                else fuse(parts, list(weights.values()), "linear", fusion)
            )
            queries.append(
                {
                    "query": q["query"],
                    "passages": q["passages"],
                    "ranks": q["ranks"],
                    "scores": labels,
                }
            )
    return queries


def refuse_degenerate(where: str, per_query: dict[str, list[list[float]]]) -> None:
    """Refuse, in one line, teacher scores a student cannot learn a ranking from
    (docs/reliability.md: each trained silently): no pair at all, no query with two passages or
    more (a single pair included), or a component that scores the passages of every query alike
    (all its scores equal included). `per_query`: each component's scores, one list per query."""
    lists = next(iter(per_query.values()), [])
    pairs = sum(len(scores) for scores in lists)
    if not pairs:
        raise DataError(f"{where} holds no pairs: nothing to train on")
    if all(len(scores) < 2 for scores in lists):
        raise DataError(
            f"{where}: every query has fewer than two passages ({pairs} pair(s) over "
            f"{len(lists)} queries): a student learns which passage of a query comes first, "
            "and there is no order to learn"
        )
    for name, scores_of in per_query.items():
        if any(np.ptp(scores) > 0 for scores in scores_of if len(scores) > 1):
            continue
        values = np.concatenate([np.asarray(s, dtype=np.float64) for s in scores_of])
        how = (
            f"all its {values.size} scores are {values[0]:g}"
            if np.ptp(values) == 0
            else "it scores the passages of each query alike"
        )
        raise DataError(f"{where}: component '{name}' is constant ({how}): nothing to learn")


def _by_rank(q: dict[str, Any]) -> dict[str, Any]:
    order = sorted(range(len(q["ranks"])), key=lambda i: q["ranks"][i])
    return {k: (v if k == "query" else [v[i] for i in order]) for k, v in q.items()}


def cut_depth(queries: list[dict[str, Any]], depth: int | None) -> list[dict[str, Any]]:
    """Each query's first `depth` passages by first-stage rank (all when None)."""
    if depth is None:
        return queries
    return [{k: (v if k == "query" else v[:depth]) for k, v in q.items()} for q in queries]


class _PredictScorer(BaseReranker):
    """A live student as a reranker for the dev evaluator: a CrossEncoder's raw logits, or a
    bi-encoder's cosines (the scores the dense reranker serves)."""

    name = "student"

    def __init__(self, model: Any, batch_size: int, bi_encoder: bool = False) -> None:
        import torch

        self.model, self.batch_size, self.identity = model, batch_size, torch.nn.Identity()
        self.model_name, self.bi_encoder = self.name, bi_encoder

    def _flat(self, requests: Sequence[Request]) -> list[float]:
        if not self.bi_encoder:
            pairs = [(q, p) for q, ps in requests for p in ps]
            return list(
                self.model.predict(
                    pairs,
                    batch_size=self.batch_size,
                    activation_fn=self.identity,
                    show_progress_bar=False,
                )
            )
        encode = dict(batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True)
        queries = self.model.encode([q for q, _ in requests], **encode)
        passages = self.model.encode([p for _, ps in requests for p in ps], **encode)
        rows = np.repeat(queries, [len(ps) for _, ps in requests], axis=0)
        return list((rows * passages).sum(axis=1))

    def score_batch(self, requests: Sequence[Request]) -> list[list[float]]:
        flat = self._flat(requests)
        out: list[list[float]] = []
        k = 0
        for _, ps in requests:
            out.append([float(v) for v in flat[k : k + len(ps)]])
            k += len(ps)
        return out


def _dev_evaluator(dev: Dataset, depth: int, batch_size: int, bi_encoder: bool = False):
    from sentence_transformers.base.evaluation import BaseEvaluator

    judged = [q for q in dev.qids if dev.qrels.get(q)]
    if not judged:
        raise DataError(f"dev set '{dev.name}' has no judged query with candidates")

    class DevNDCG(BaseEvaluator):
        def __init__(self) -> None:
            super().__init__()
            self.name = dev.name.replace("-", "_")
            self.primary_metric = "ndcg@10"

        def __call__(self, model, output_path=None, epoch=-1, steps=-1) -> dict[str, float]:
            t = time.perf_counter()
            scorer = _PredictScorer(model, batch_size, bi_encoder)
            scores = score_dataset(scorer, dev, depth, judged)
            metrics = {"ndcg@10": ndcg10(scores, dev.qrels)}
            log.info(
                "dev %s nDCG@10 %.4f (%.0f s)",
                dev.name,
                metrics["ndcg@10"],
                time.perf_counter() - t,
            )
            metrics = self.prefix_name_to_metrics(metrics, self.name)
            self.store_metrics_in_model_card_data(model, metrics, epoch, steps)
            return metrics

    return DevNDCG()


def _write_curve(out: Path, history: list[dict[str, Any]]) -> None:
    keys = ["step", "epoch", "loss", "learning_rate", "grad_norm"]
    dev_keys = sorted({k for h in history for k in h if k.startswith("eval_") and "ndcg" in k})
    lines = ["\t".join(keys + dev_keys)]
    for h in history:
        if not any(k in h for k in ("loss", *dev_keys)):
            continue
        lines.append("\t".join("" if h.get(k) is None else f"{h[k]:.6g}" for k in keys + dev_keys))
    atomic_write_text(out / CURVE_FILE, "\n".join(lines) + "\n")


def train(
    data: Sequence[str | Path],
    out: str | Path,
    config: TrainConfig,
    dev: Dataset | None = None,
    *,
    teacher_sets: Sequence[str | Path] = (),
    pool: str | Path | None = None,
    resume: bool = False,
    keep_checkpoints: bool = False,
    device: str | None = None,
) -> dict[str, Any]:
    """Train, keep the best checkpoint by dev nDCG@10 (the last one without a dev set), save it
    to `out`; returns the training record also written to `out/distill-training.json`.

    Training pairs come from `distill generate` folders (`data`) and committed teacher sets
    (`teacher_sets`, their text joined back from `pool` or the named dataset; labels fused as
    `config.teacher_fuse` says). `dev` is the loaded `config.dev_dataset` (or any judged
    dataset; None: no dev evaluation, the last checkpoint is kept)."""
    require("datasets", "train", "training a cross-encoder")
    from datasets import Dataset as HFDataset

    out = Path(out)
    if (out / TRAINING_FILE).is_file() and not resume:
        raise DataError(f"'{out}' already holds a trained model; pick another --out")
    if not data and not teacher_sets:
        raise DataError("give --data (a distill generate output) or --teacher-set (repeatable)")
    manifests = [R.read_manifest(f) for f in data]
    queries = training_queries(data, teacher_sets, pool, config)
    loss = load_loss(config.loss)
    bi = config.student == "bi"
    examples = loss.examples(queries, config)
    if bi:
        examples = loss.bi_examples(examples)
    if not len(examples):  # transformers would fail on max_steps 0 with a traceback
        raise DataError(f"no training examples from {len(queries)} queries ({config.loss})")
    log.info("%d queries, %d training examples (%s)", len(queries), len(examples), config.loss)

    model = _student(config, device)
    evaluator = _dev_evaluator(dev, config.dev_depth, config.batch_size, bi) if dev else None
    checkpoints = out / "checkpoints"
    out.mkdir(parents=True, exist_ok=True)
    trainer = _trainer_class(loss.sampler(examples), bi)(
        model=model,
        args=_arguments(config, checkpoints, evaluator, device),
        train_dataset=HFDataset.from_dict(examples.columns),
        loss=loss.bi_module(model) if bi else loss.module(model),
        evaluator=evaluator,
        callbacks=[_curve_writer(out)],
    )
    started = time.perf_counter()
    has_checkpoint = resume and checkpoints.is_dir() and any(checkpoints.glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if has_checkpoint else None)
    seconds = time.perf_counter() - started
    model.save_pretrained(str(out))
    history = trainer.state.log_history
    _write_curve(out, history)
    record = {
        "kind": "distill-student",
        "config": config.model_dump(mode="json"),
        "data": [
            {"folder": str(f), "teacher": m["identity"]["teacher"], "pairs": m["pairs"]}
            for f, m in zip(data, manifests, strict=True)
        ],
        "teacher_sets": [str(p) for p in teacher_sets],
        "queries": len(queries),
        "examples": len(examples),
        "dev": None if dev is None else {"dataset": dev.name, "depth": config.dev_depth},
        "best_checkpoint": trainer.state.best_model_checkpoint,
        "best_dev_metric": trainer.state.best_metric,
        "train_seconds": round(seconds, 1),
        "history": history,
        "cisrank_version": __version__,
    }
    atomic_write_text(out / TRAINING_FILE, json.dumps(record, indent=2, default=str) + "\n")
    if not keep_checkpoints:
        shutil.rmtree(checkpoints, ignore_errors=True)
    return record


def training_queries(
    data: Sequence[str | Path],
    teacher_sets: Sequence[str | Path],
    pool: str | Path | None,
    config: TrainConfig,
) -> list[Query]:
    """Every query's list to train on: those of the teacher rows `data`, then of the teacher
    sets, each cut to `config.list_depth` passages."""
    queries = load_teacher_rows(data) if data else []
    if teacher_sets:
        queries += load_teacher_sets(
            teacher_sets, config.teacher_fuse, config.teacher_fusion, pool, config.seed
        )
    queries = cut_depth(queries, config.list_depth)
    if config.list_depth is not None:
        depth = f"the training lists cut to --list-depth {config.list_depth}"
        refuse_degenerate(depth, {"label": [q["scores"] for q in queries]})
    return queries


def _student(config: TrainConfig, device: str | None) -> Any:
    """The student: `config.base_model` with a one-logit head, or (a bi-encoder) the base
    sentence-transformers model itself, its pooling and normalization kept."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.cross_encoder import CrossEncoder
    from transformers import set_seed

    path = resolve_model(config.base_model)
    # Seeded before the model is made: its classification head is initialised at random when
    # loaded, and the trainer seeds only after that, so an unseeded head made every run another
    # student (`make student` promises the same one from a clean clone).
    set_seed(config.seed)
    try:
        if config.student == "bi":
            model = SentenceTransformer(path, device=device)
            model.max_seq_length = config.max_length
            return model
        return CrossEncoder(path, num_labels=1, max_length=config.max_length, device=device)
    except OSError as exc:
        raise ModelNotFoundError(f"cannot load base model '{config.base_model}': {exc}") from exc


def _arguments(
    config: TrainConfig, checkpoints: Path, evaluator: Any, device: str | None = None
) -> Any:
    """The trainer's arguments: checkpoints evaluated (with a dev set) and kept each epoch or
    each `config.eval_steps`, the best by dev nDCG@10 loaded at the end."""
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.cross_encoder import CrossEncoderTrainingArguments

    strategy = "steps" if config.eval_steps else "epoch"
    arguments = (
        SentenceTransformerTrainingArguments
        if config.student == "bi"
        else CrossEncoderTrainingArguments
    )
    return arguments(
        output_dir=str(checkpoints),
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        warmup_ratio=config.warmup_ratio,
        weight_decay=config.weight_decay,
        lr_scheduler_type="linear",
        eval_strategy=strategy if evaluator else "no",
        eval_steps=config.eval_steps,
        save_strategy=strategy,
        save_steps=config.eval_steps or 500,  # read only with "steps"; 500 is HF's default
        save_total_limit=2,
        load_best_model_at_end=evaluator is not None,
        metric_for_best_model=f"eval_{evaluator.name}_ndcg@10" if evaluator else None,
        greater_is_better=True,
        logging_steps=config.logging_steps,
        report_to="none",
        seed=config.seed,
        data_seed=config.seed,
        dataloader_drop_last=False,
        disable_tqdm=False,
        bf16=config.bf16,
        # bf16 on a CPU is autocast there, which the trainer allows only when told it is one
        use_cpu=config.bf16 and _on_cpu(device),
    )


def _on_cpu(device: str | None) -> bool:
    import torch

    return device == "cpu" or (device in (None, "auto") and not torch.cuda.is_available())


def _trainer_class(sampler_class: type | None, bi_encoder: bool = False) -> Any:
    """sentence-transformers' trainer of the student's kind, its training set batched by
    `sampler_class` (the loss's; None: its default)."""
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.cross_encoder import CrossEncoderTrainer

    base = SentenceTransformerTrainer if bi_encoder else CrossEncoderTrainer

    class _Trainer(base):  # type: ignore[valid-type,misc]
        def get_batch_sampler(
            self,
            dataset: Any,
            batch_size: int,
            drop_last: bool,
            valid_label_columns: list[str] | None = None,
            generator: Any = None,
            seed: int = 0,
        ) -> Any:
            extra = {"valid_label_columns": valid_label_columns, "generator": generator}
            if dataset is self.train_dataset and sampler_class is not None:
                return sampler_class(
                    dataset, batch_size=batch_size, drop_last=drop_last, seed=seed, **extra
                )
            return super().get_batch_sampler(dataset, batch_size, drop_last, seed=seed, **extra)

    return _Trainer


def _curve_writer(folder: Path) -> Any:
    """A trainer callback that rewrites the learning curve at every log."""
    from transformers import TrainerCallback

    class _Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            _write_curve(folder, state.log_history)

    return _Log()
