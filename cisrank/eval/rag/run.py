"""`run_rag_eval`: which reranker's passages answer the question? The pipeline behind
`cisrank eval rag`.

For each question: its candidate set (`questions.candidate_sets`), ranked by every reranker
named (`first-stage` is the candidates' own order); each reranker's top k (every k of `top_k`)
goes to the generator in `arrange`'s order (default `reverse`: the best passage next to the
question, the arrangement that answered best on NQ-Open with SmolLM2, bench/RESULTS.md), greedy,
as `cisrank generate` answers (`answer_question`); the closed-book (no passage) and gold-only
answers are the baselines. Rankings are computed once per reranker and answers once per prompt
(`cache`), on a worker per core (`jobs`); the figures and their paired tests are `report`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator, model_validator
from tqdm.auto import tqdm

from cisrank.config import ComponentConfig
from cisrank.context.config import Arrangement
from cisrank.data.types import Passage, rank_order
from cisrank.errors import CisrankError
from cisrank.eval.rag.answers import judge
from cisrank.eval.rag.cache import GenerationCache, PartsCache, ScoreCache, Scored, prompt_key
from cisrank.eval.rag.jobs import AnswerJob, GeneratorSetting, PartsJob, RankJob, run_items
from cisrank.eval.rag.questions import CandidateSet, Distractors, candidate_sets, load_questions
from cisrank.eval.rag.report import CLOSED_BOOK, GOLD_ONLY, summarize, write_outputs
from cisrank.jobs.pool import WorkerOptions, for_device
from cisrank.rerank.spec import RerankerSpec
from cisrank.version import __version__

log = logging.getLogger(__name__)

FIRST_STAGE = "first-stage"
"""The candidates' own order (BM25's, or the file's): a reranker of kind `none`."""
QUESTIONS_PER_CALL = 8
"""Questions per `score_batch` call and per stored chunk: enough for a reranker to fill its
batches across questions, few enough that a killed run loses little."""
PASSAGES_PER_CALL = 20
"""Passages per request of a query-free side (the prior): one question's worth, so that a
chunk of `QUESTIONS_PER_CALL` requests is the work of one chunk of questions."""
PROMPTS_PER_CALL = 8
"""Prompts answered side by side in one decoding (`answer_each`): SmolLM2-135M on one CPU
thread answered 32 of the eval's prompts (0 to 5 passages) in chunks of 8 1.65x as fast as one at
a time, each answer token for token the same (bench/answer_each.py, bench/RESULTS.md)."""


class RagEvalConfig(ComponentConfig):
    """What `cisrank eval rag` asks: the questions, their candidates, the answers' generation."""

    label: ClassVar[str] = "RAG evaluation"

    questions: Path = Field(
        description="NQ-Open oracle-shaped JSON lines (gzip or not): question, answers, ctxs."
    )
    first: int = Field(default=0, ge=0, description="Index of the first question used.")
    limit: int | None = Field(default=None, ge=1, description="Questions used (default: all).")
    candidates: int = Field(
        default=20, ge=1, description="Candidates per question, the gold included."
    )
    distractors: Distractors = Field(
        default="related",
        description="related (the question's top BM25 hits over the file's other passages "
        "that hold no answer), random, or given (the question's own ctxs).",
    )
    top_k: Annotated[tuple[int, ...], Field(min_length=1)] = Field(
        default=(1, 3, 5), description="How many of a reranker's best passages go to the generator."
    )
    generator: str | None = Field(
        default=None,
        description="The causal LM that answers (any causal LM or catalogue name); none: the "
        "retrieval figures alone.",
    )
    arrange: Arrangement = Field(
        default=Arrangement.REVERSE,
        description="The order of the top k in the prompt: reverse (the best next to the "
        "question), ranked, edges, pmi_rotation, likelihood_select or curvature.",
    )
    template: str = Field(default="qa", description="The prompt template (cisrank context's).")
    chat: bool | None = Field(
        default=None,
        description="Wrap the prompt in the generator's chat template (default: when it has one).",
    )
    max_new_tokens: int = Field(default=32, ge=1, description="Most tokens an answer has.")
    baselines: bool = Field(default=True, description="Also answer closed-book and gold-only.")
    seed: int = Field(default=0, description="Seed of the random distractors.")
    skip_short: bool = Field(
        default=True,
        description="Leave out a question that cannot have the candidates asked (its answer in "
        "nearly every passage, or fewer ctxs than asked), listed with why in metrics.json "
        "'skipped'; off: such a question stops the run before any model loads.",
    )
    device: str | None = Field(default=None, description="The generator's torch device.")
    dtype: str | None = Field(default=None, description="The generator's compute type.")

    @field_validator("generator", mode="before")
    @classmethod
    def _no_generator(cls, value: Any) -> Any:
        """ "none" (any case) is the documented way to ask for no generator on the command line,
        where an absent flag cannot be written; never a model id."""
        if isinstance(value, str) and value.strip().lower() in ("", "none"):
            return None
        return value

    @field_validator("top_k", mode="before")
    @classmethod
    def _ks(cls, value: Any) -> Any:
        """ "1,3,5" (a flag's text) as numbers; any order and repeats, kept sorted once."""
        if isinstance(value, str):
            try:
                value = [int(x) for x in value.split(",") if x.strip()]
            except ValueError:
                raise ValueError(f"expected comma-separated integers, got {value!r}") from None
        return tuple(sorted(set(value))) if isinstance(value, list | tuple) else value

    @model_validator(mode="after")
    def _ks_fit(self) -> RagEvalConfig:
        bad = [k for k in self.top_k if not 1 <= k <= self.candidates]
        if bad:
            raise ValueError(f"top_k {bad} must be between 1 and the {self.candidates} candidates")
        return self

    def setting(self) -> GeneratorSetting | None:
        """How answers are generated, or None without a generator."""
        if self.generator is None:
            return None
        return GeneratorSetting(
            self.generator,
            self.template,
            self.chat,
            str(self.arrange),
            self.max_new_tokens,
            self.device,
            self.dtype,
        )


@dataclass
class RagResult:
    """The figures (`metrics`, as metrics.json), one record per question (as
    per_question.jsonl) and the folder they were written to."""

    metrics: dict[str, Any]
    records: list[dict[str, Any]]
    output: Path | None


def with_first_stage(rerankers: Mapping[str, RerankerSpec]) -> dict[str, RerankerSpec]:
    """`rerankers` after the first stage (kind `none`, always measured: the baseline every
    reranker is compared with); the name `first-stage` may only be that."""
    given = dict(rerankers)
    first = given.pop(FIRST_STAGE, None)
    if first is not None and not first.keeps_order:
        raise CisrankError(
            f"the name '{FIRST_STAGE}' is the candidates' own order (kind none), not {first.kind}"
        )
    return {FIRST_STAGE: RerankerSpec(kind="none"), **given}


_OUTPUTS = ("metrics.json", "per_question.jsonl", "cache")


def _claim(output: Path, resume: bool) -> None:
    """An output folder holding an earlier run is reused only on request (`resume`)."""
    held = [name for name in _OUTPUTS if (output / name).exists()]
    if held and not resume:
        raise CisrankError(
            f"--output {output} holds an earlier run ({', '.join(held)}): pass --resume to go "
            "on with it (every ranking and answer it stored is reused), or choose another folder"
        )
    output.mkdir(parents=True, exist_ok=True)


def _bar(total: int, desc: str, progress: bool) -> Any:
    return tqdm(total=total, desc=desc, unit="question", disable=not progress or total == 0)


def rank(
    sets: Sequence[CandidateSet],
    spec: RerankerSpec,
    cache_root: Path,
    workers: WorkerOptions,
    name: str = "",
    progress: bool = False,
) -> list[Scored]:
    """Every question's candidate scores under `spec`: from the cache where stored, else scored
    in chunks of `QUESTIONS_PER_CALL` questions on `workers` (one process on a GPU, which one
    process fills), each chunk stored as it ends."""
    if spec.keeps_order:
        return [
            Scored([float(len(s.passages) - i) for i in range(len(s.passages))], 0.0) for s in sets
        ]
    pointwise = spec.record is not None and not spec.record.fuses
    key = {"kind": spec.kind, "model": spec.model, "options": spec.options}
    cache = ScoreCache(cache_root, key, pointwise)
    requests = [(s.question.question, s.texts) for s in sets]
    got: list[Scored | None] = [cache.get(q, texts) for q, texts in requests]
    missing = [i for i, g in enumerate(got) if g is None]
    if missing and spec.record is not None and spec.record.estimate_fields:
        scored = _rank_by_parts(
            [requests[i] for i in missing], spec, cache_root, workers, name, progress
        )
        for i, value in zip(missing, scored, strict=True):
            got[i] = value
        missing = []
    chunks = [
        missing[a : a + QUESTIONS_PER_CALL] for a in range(0, len(missing), QUESTIONS_PER_CALL)
    ]
    items = [[requests[i] for i in chunk] for chunk in chunks]
    with _bar(len(missing), f"rank ({name or spec.kind})", progress) as bar:

        def done(j: int, result: tuple[list[list[float]], float]) -> None:
            scores, seconds = result
            cache.put(items[j], scores, seconds)
            for i, values in zip(chunks[j], scores, strict=True):
                got[i] = Scored(values, seconds / len(chunks[j]))
            bar.update(len(chunks[j]))

        pool = for_device(workers, spec.options.get("device")) if items else workers
        run_items(RankJob(spec, pool.threads_per_worker), items, pool, done)
    out = [g for g in got if g is not None]
    assert len(out) == len(sets)
    return out


def _rank_by_parts(
    requests: Sequence[tuple[str, list[str]]],
    spec: RerankerSpec,
    cache_root: Path,
    workers: WorkerOptions,
    name: str,
    progress: bool,
) -> list[Scored]:
    """`rank` for a kind whose settings combine the same model sums (CIS: the registry's
    `estimate_fields`): each side the setting reads (`config.sides()`) is computed once per
    setting of that side (`config.side_setting`) and stored (`PartsCache`), and the scores are
    `config.estimate` of them, the arithmetic `CISReranker.score_batch` does. A grid of
    estimators, priors, normalizations and templates costs one pass of each side and template,
    not one per setting; the prior (query-free) is computed once per distinct passage."""
    record = spec.record
    assert record is not None
    config: Any = record.config(**spec.options)
    caches = []
    for side in config.sides():
        key = {"kind": spec.kind, "model": spec.model, "setting": config.side_setting(side)}
        cache = PartsCache(cache_root, side, key, query_free=side in config.QUERY_FREE_SIDES)
        todo = cache.missing(requests, PASSAGES_PER_CALL)
        _compute_side(todo, spec, cache, workers, f"{name or spec.kind}: {side}", progress)
        caches.append(cache)
    out = []
    for q, texts in requests:
        rows: list[dict[str, float]] = [{} for _ in texts]
        for cache in caches:
            for row, part in zip(rows, cache.parts(q, texts), strict=True):
                row.update(part)
        out.append(Scored(config.estimate(rows), sum(c.seconds(q, texts) for c in caches)))
    return out


def _compute_side(
    requests: Sequence[tuple[str, list[str]]],
    spec: RerankerSpec,
    parts: PartsCache,
    workers: WorkerOptions,
    label: str,
    progress: bool,
) -> None:
    """`parts.side` of `spec`'s model sums for `requests`, in chunks of `QUESTIONS_PER_CALL`
    requests on `workers`, each chunk stored as it ends."""
    items = [
        list(requests[a : a + QUESTIONS_PER_CALL])
        for a in range(0, len(requests), QUESTIONS_PER_CALL)
    ]
    with _bar(len(requests), f"rank ({label})", progress) as bar:

        def done(j: int, result: tuple[list[list[dict[str, float]]], float]) -> None:
            rows, seconds = result
            parts.put(items[j], rows, seconds)
            bar.update(len(items[j]))

        pool = for_device(workers, spec.options.get("device")) if items else workers
        run_items(PartsJob(spec, parts.side, pool.threads_per_worker), items, pool, done)


def _prompts(
    sets: Sequence[CandidateSet],
    orders: Mapping[str, Sequence[Sequence[int]]],
    ks: Sequence[int],
    arrange: str,
    baselines: bool,
) -> tuple[dict[str, tuple[str, list[Passage]]], list[dict[str, dict[str, str]]]]:
    """The distinct prompts to answer, by key, and per question {row: {k: key}} (rows: the
    rerankers, then the baselines under k "0" (closed book) and "1" (gold only))."""
    prompts: dict[str, tuple[str, list[Passage]]] = {}
    keys: list[dict[str, dict[str, str]]] = []
    for i, s in enumerate(sets):
        question = s.question.question
        mine: dict[str, dict[str, str]] = {}
        rows: list[tuple[str, str, list[Passage]]] = [
            (name, str(k), [s.passages[j] for j in order[i][:k]])
            for name, order in orders.items()
            for k in ks
        ]
        if baselines:
            rows += [(CLOSED_BOOK, "0", []), (GOLD_ONLY, "1", [s.passages[s.gold]])]
        for row, k, passages in rows:
            key = prompt_key(question, passages, arrange)
            prompts.setdefault(key, (question, passages))
            mine.setdefault(row, {})[k] = key
        keys.append(mine)
    return prompts, keys


def answer(
    prompts: Mapping[str, tuple[str, list[Passage]]],
    setting: GeneratorSetting,
    cache_root: Path,
    workers: WorkerOptions,
    progress: bool = False,
) -> dict[str, dict[str, Any]]:
    """Every prompt's answer: from the cache where stored, else generated on `workers`, each
    stored as it ends."""
    cache = GenerationCache(cache_root, setting.to_json())
    out: dict[str, dict[str, Any]] = {}
    todo = []
    for key in prompts:
        hit = cache.get(key)
        if hit is None:
            todo.append(key)
        else:
            out[key] = hit
    with tqdm(
        total=len(todo), desc="answer", unit="prompt", disable=not progress or not todo
    ) as bar:
        # Prompts of about the same length decode side by side, so that no row waits behind
        # (and no step computes attention over) a far longer neighbour's context.
        todo.sort(key=lambda k: (len(prompts[k][1]), sum(len(p.text) for p in prompts[k][1])))
        chunks = [todo[a : a + PROMPTS_PER_CALL] for a in range(0, len(todo), PROMPTS_PER_CALL)]

        def done(j: int, results: list[dict[str, Any]]) -> None:
            for key, result in zip(chunks[j], results, strict=True):
                cache.put(key, result)
                out[key] = result
            bar.update(len(chunks[j]))

        pool = for_device(workers, setting.device) if todo else workers
        items = [[prompts[k] for k in chunk] for chunk in chunks]
        run_items(AnswerJob(setting), items, pool, done)
    return out


def _record(
    s: CandidateSet,
    scores: Mapping[str, Scored],
    orders: Mapping[str, list[int]],
    keys: Mapping[str, Mapping[str, str]],
    answers: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """One line of per_question.jsonl."""
    q = s.question
    rec: dict[str, Any] = {
        "index": q.index,
        "question": q.question,
        "answers": q.answers,
        "candidates": [p.text for p in s.passages],
        "titles": [p.title for p in s.passages],
        "gold": s.gold,
        "order": dict(orders),
        "scores": {name: sc.scores for name, sc in scores.items()},
    }
    if not answers:
        return rec
    generated: dict[str, dict[str, str]] = {}
    prompt: dict[str, dict[str, list[int]]] = {}
    verdicts: dict[str, dict[str, dict[str, Any]]] = {}
    baselines: dict[str, dict[str, Any]] = {}
    for row, by_k in keys.items():
        for k, key in by_k.items():
            got = answers[key]
            verdict = judge(got["answer"], q.answers).to_json()
            if row in (CLOSED_BOOK, GOLD_ONLY):
                baselines[row] = {"answer": got["answer"], **verdict}
                continue
            top = orders[row][: int(k)]
            generated.setdefault(row, {})[k] = got["answer"]
            prompt.setdefault(row, {})[k] = [top[j] for j in got["order"]]
            verdicts.setdefault(row, {})[k] = verdict
    rec.update(generated=generated, prompt=prompt, verdicts=verdicts)
    if baselines:
        rec["baselines"] = baselines
    return rec


def _cost(
    names: Sequence[str],
    scores: Mapping[str, Sequence[Scored]],
    keys: Sequence[Mapping[str, Mapping[str, str]]],
    answers: Mapping[str, Mapping[str, Any]],
    wall: Mapping[str, float],
) -> dict[str, Any]:
    """Seconds per question per reranker (the model time of the questions it scored, one
    worker's, so per core; a chunk's wall seconds shared by its questions) and per generation,
    by k, over the distinct prompts (a side-by-side chunk's seconds shared by its prompts)."""
    out: dict[str, Any] = {"rerankers": {}, "generation": {}}
    for name in names:
        timed = [s.seconds for s in scores[name] if s.seconds > 0]
        out["rerankers"][name] = {
            "seconds_per_question": sum(timed) / len(timed) if timed else None,
            "questions_timed": len(timed),
            "wall_seconds_this_run": wall.get(name, 0.0),
        }
    by_k: dict[str, dict[str, float]] = {}
    for mine in keys:
        for row, ks in mine.items():
            for k, key in ks.items():
                label = row if row in (CLOSED_BOOK, GOLD_ONLY) else k
                by_k.setdefault(label, {})[key] = float(answers[key]["seconds"])
    for label, seconds in sorted(by_k.items()):
        out["generation"][label] = {
            "seconds_per_generation": sum(seconds.values()) / len(seconds),
            "generations": len(seconds),
        }
    out["generation_wall_seconds_this_run"] = wall.get("answer", 0.0)
    return out


def run_rag_eval(
    config: RagEvalConfig,
    rerankers: Mapping[str, RerankerSpec],
    output: Path | None = None,
    *,
    cache: Path | None = None,
    workers: WorkerOptions | None = None,
    resume: bool = False,
    progress: bool = False,
) -> RagResult:
    """Measure `rerankers` (plus the first stage) on `config`'s questions: the retrieval figures
    (gold recall@k, MRR) and, with a generator, the answers' accuracy, EM and F1 with their
    paired tests; written to `output` (metrics.json, per_question.jsonl, rag.png) when given.

    Stored rankings and answers live in `cache` (default `output/cache`; needed without an
    output); an `output` holding an earlier run is reused only with `resume`. Every spec was
    checked when it was made, before any model loads."""
    workers = workers or WorkerOptions()
    specs = with_first_stage(rerankers)
    cache_root = Path(cache) if cache is not None else (Path(output) / "cache" if output else None)
    if cache_root is None:
        raise CisrankError("give an output folder or a cache folder: rankings are stored there")
    # read before the output folder is made: a refused file leaves no empty folder behind
    everything = load_questions(config.questions)
    if output is not None:
        _claim(Path(output), resume)
    end = None if config.limit is None else config.first + config.limit
    chosen = everything[config.first : end]
    if not chosen:
        raise CisrankError(
            f"--first {config.first}: the file holds {len(everything)} questions, none from there"
        )
    sets, skipped = candidate_sets(
        chosen, everything, config.candidates, config.distractors, config.seed, config.skip_short
    )
    wall: dict[str, float] = {}
    scores: dict[str, list[Scored]] = {}
    for name, spec in specs.items():
        started = time.perf_counter()
        scores[name] = rank(sets, spec, cache_root, workers, name, progress)
        wall[name] = time.perf_counter() - started
    orders = {name: [rank_order(s.scores) for s in got] for name, got in scores.items()}
    setting = config.setting()
    answers: dict[str, dict[str, Any]] = {}
    keys: list[dict[str, dict[str, str]]] = [{} for _ in sets]
    if setting is not None:
        prompts, keys = _prompts(sets, orders, config.top_k, setting.arrange, config.baselines)
        started = time.perf_counter()
        answers = answer(prompts, setting, cache_root, workers, progress)
        wall["answer"] = time.perf_counter() - started
    records = [
        _record(
            s,
            {n: scores[n][i] for n in specs},
            {n: orders[n][i] for n in specs},
            keys[i],
            answers,
        )
        for i, s in enumerate(sets)
    ]
    metrics = summarize(records, list(specs), config.top_k)
    metrics["skipped"] = [{"question": i, "reason": why} for i, why in skipped.items()]
    metrics["settings"] = {
        **config.model_dump(mode="json"),
        "rerankers": {
            n: s.model_dump(mode="json", exclude_defaults=True) for n, s in specs.items()
        },
        "workers": workers.count,
        "threads_per_worker": workers.threads_per_worker,
        "cisrank_version": __version__,
    }
    metrics["cost"] = _cost(list(specs), scores, keys, answers, wall)
    if output is not None:
        write_outputs(Path(output), metrics, records)
    return RagResult(metrics, records, Path(output) if output is not None else None)
