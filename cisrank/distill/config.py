"""Typed settings of distillation: training (`TrainConfig`) and the chained run (`RunPlan`).

Their defaults are the recipe measured in bench/RESULTS.md (MiniLM student, DL19 nDCG@10 0.6052)
and live here only: the CLI's flags default to None ("keep the default") and print these in their
help. Kept apart from `train` and `pipeline` so that the CLI reads them without importing the
training stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from pydantic import Field, ValidationError, field_validator, model_validator

from cisrank.config import ComponentConfig, Flag
from cisrank.distill.losses import NAMES, loss_help
from cisrank.errors import DataError

Normalize = Literal["none", "query"]
if TYPE_CHECKING:
    Loss = str
else:  # the loss registry's names, as the Literal pydantic checks and its errors list
    Loss = Literal[NAMES]


class TrainConfig(ComponentConfig):
    """How a student is trained on teacher rows; recorded in the student's training record.

    The fields marked `Flag()` are the flags of `distill train` (in field order) and, but for
    those about teacher sets and lists, of `distill run`."""

    label: ClassVar[str] = "training"
    flags: ClassVar[dict[str, str]] = {
        "learning_rate": "lr",
        "batch_size": "train_batch_size",
        "normalize": "label_norm",
    }
    """Fields whose CLI flag has another name (the teacher's `--batch-size` is taken)."""

    teacher_fuse: Annotated[str | None, Flag()] = Field(
        default=None,
        description="With teacher sets: the components and weights of the labels, "
        "'cis:1,dense:0.5' (per-query normalized and summed; the first component alone when "
        "unset).",
    )
    teacher_fusion: Annotated[Literal["zscore", "minmax"], Flag()] = Field(
        default="zscore", description="Per-query normalization of the fused components."
    )
    list_depth: Annotated[int | None, Flag()] = Field(
        default=None,
        ge=2,
        description="Each query's first N passages by first-stage rank (all when unset).",
    )
    temperature: Annotated[float, Flag()] = Field(
        default=1.0,
        gt=0.0,
        description="listwise: the teacher's (normalized) scores are divided by it before the "
        "softmax; below 1 sharpens the target towards the teacher's top passages.",
    )
    base_model: Annotated[str, Flag()] = Field(
        default="all-MiniLM-L6-v2", description="Student initialisation: Hugging Face id or folder."
    )
    student: Annotated[Literal["cross", "bi"], Flag()] = Field(
        default="cross",
        description="cross: a cross-encoder, the base model reads query and passage together, "
        "under a new one-logit head; bi: a bi-encoder, the base sentence-transformers model "
        "embeds them apart and "
        "a pair scores their cosine (its pre-training kept, passage embeddings cacheable).",
    )
    bf16: Annotated[bool, Flag()] = Field(
        default=False,
        description="Train in bf16 mixed precision (autocast; on a CPU with native bf16 or a GPU).",
    )
    epochs: Annotated[float, Flag()] = Field(default=2.0, gt=0.0)
    learning_rate: Annotated[float, Flag()] = Field(default=2e-4, gt=0.0)
    batch_size: Annotated[int, Flag()] = Field(default=32, ge=1, description="Pairs per step.")
    max_length: Annotated[int, Flag()] = Field(
        default=256, ge=8, description="Student token limit."
    )
    normalize: Annotated[Normalize, Flag()] = Field(
        default="query",
        description="'query': standardize teacher scores per query; 'none': raw.",
    )
    loss: Annotated[Loss, Flag()] = Field(default="mse", description=loss_help())
    dev_dataset: Annotated[str | None, Flag()] = Field(
        default="trec-dl21",
        description="Judged dataset for checkpoint selection by nDCG@10; 'none' to skip.",
    )
    """Loaded by the caller (the CLI, `distill_run`); `train` takes the loaded dataset."""
    dev_depth: Annotated[int, Flag()] = Field(
        default=30, ge=1, description="Dev candidates reranked."
    )
    eval_steps: Annotated[int | None, Flag()] = Field(
        default=None,
        ge=1,
        description="Evaluate and checkpoint every N steps (default: each epoch).",
    )
    seed: Annotated[int, Flag()] = 12
    warmup_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    weight_decay: float = Field(default=0.01, ge=0.0)
    logging_steps: int = Field(default=50, ge=1)
    margin_pairs: int = Field(default=1, ge=1)

    @field_validator("dev_dataset")
    @classmethod
    def _none_means_no_dev(cls, name: str | None) -> str | None:
        # The string 'none' (a flag value) skips dev evaluation; None is "keep the default".
        return None if name == "none" else name

    @model_validator(mode="wrap")
    @classmethod
    def _errors_name_flags(cls, data: Any, handler: Any) -> Self:
        """One line naming the flag (`--lr must be greater than 0, got -1.0`) from the CLI, a
        config file or code alike, instead of a pydantic report."""
        try:
            return handler(data)
        except ValidationError as exc:
            raise DataError("; ".join(cls._flag_error(e) for e in exc.errors())) from None

    @classmethod
    def _flag_error(cls, error: Any) -> str:
        field = str(error["loc"][0]) if error["loc"] else ""
        flag = "--" + cls.flags.get(field, field).replace("_", "-")
        message = str(error["msg"])
        if message.startswith("Input should be "):
            return (
                f"{flag} must be {message.removeprefix('Input should be ')}, got {error['input']!r}"
            )
        return f"{flag}: {message}"


class RunPlan(ComponentConfig):
    """What `distill run` scores, trains on and evaluates."""

    label: ClassVar[str] = "distill run"

    train_datasets: list[str] = Field(
        default=["trec-dl22", "trec-dl21"], description="Query sets the teacher scores."
    )
    triples: Path | None = Field(
        default=None, description="Also MS MARCO triples (query, pos, neg)."
    )
    eval_dataset: str = "trec-dl19"
    depth: int = Field(default=100, ge=1, description="Candidates scored per query.")
    eval_depth: int = Field(default=100, ge=1)


FilterKind = Literal["none", "first-stage", "teacher"]


class SynthConfig(ComponentConfig):
    """How queries are written and filtered; recorded in `synth.json`. The `Flag()` fields are
    the flags of `distill synth`."""

    label: ClassVar[str] = "distill synth"

    generator: Annotated[str, Flag()] = Field(
        default="smollm2-135m-instruct",
        description="The causal LM that writes the queries: a catalogue name, Hugging Face id or "
        "folder. Default SmolLM2-135M-Instruct, which wrote the committed synthetic teacher set "
        "(54% kept by the round trip, 1.05 s a query a core on AMD EPYC; Qwen2.5-Coder-0.5B costs "
        "about 1.9x, its yield not measured yet, bench/RESULTS.md, 'A student that beats similarity').",
    )
    passages: Annotated[int | None, Flag()] = Field(
        default=None,
        ge=1,
        description="Write queries for this many passages, a seeded sample (all when unset; a "
        "larger sample of the same seed reuses a smaller one's queries).",
    )
    queries_per_passage: Annotated[int, Flag()] = Field(
        default=1, ge=1, description="Queries written per passage (each from other shots)."
    )
    num_shots: Annotated[int, Flag()] = Field(
        default=3, ge=0, description="Real (passage, query) examples in each prompt."
    )
    shot_chars: Annotated[int, Flag()] = Field(
        default=400, ge=20, description="Each example passage cut to this many characters."
    )
    passage_chars: Annotated[int, Flag()] = Field(
        default=600, ge=20, description="The passage asked about cut to this many characters."
    )
    max_new_tokens: Annotated[int, Flag()] = Field(
        default=32, ge=1, description="Tokens a query may take (it ends at a line break)."
    )
    max_words: Annotated[int, Flag()] = Field(
        default=24, ge=1, description="A reply of more words is dropped as no query."
    )
    temperature: Annotated[float, Flag()] = Field(
        default=0.0,
        ge=0.0,
        description="0: greedy (each query differs by its shots); above 0: sampled, seeded per "
        "query.",
    )
    top_p: Annotated[float, Flag()] = Field(
        default=1.0, gt=0.0, le=1.0, description="Nucleus sampling's mass (with --temperature)."
    )
    seed: Annotated[int, Flag()] = 12
    dtype: Annotated[str | None, Flag()] = Field(
        default=None,
        description="The generator's compute type (default: bf16 on a GPU or a CPU with native "
        "bf16, else float32).",
    )
    shard_passages: Annotated[int, Flag()] = Field(
        default=16, ge=1, description="Passages per shard (decoded side by side)."
    )
    filter: Annotated[FilterKind, Flag()] = Field(
        default="first-stage",
        description="Keep a query only where its source passage ranks in the top --keep-top: "
        "of the first stage's candidates (first-stage), of a teacher's order of them and the "
        "source (teacher), or keep every query (none).",
    )
    keep_top: Annotated[int, Flag()] = Field(
        default=1, ge=1, description="The rank the source passage must reach to keep a query."
    )
    depth: Annotated[int, Flag()] = Field(
        default=20, ge=1, description="First-stage candidates written (and filtered) per query."
    )
