"""Settings of RAG context assembly and generation: the modes as enums, one config per component.

Each default is declared here and only here; `cisrank context`, `cisrank generate`, `/v1/context`
and `/v1/generate` read theirs from these classes. The enums are str-valued, so a mode is the same
string on the command line, in JSON and in Python (`Arrangement.CURVATURE == "curvature"`).

This module imports no model code (pydantic only): the CLI and the API schemas read it at start.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Self

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from cisrank.config import ComponentConfig
from cisrank.errors import CisrankError


class _Mode(StrEnum):
    """A mode named by its string; `parse` turns a user's string into the member, or says which
    strings there are."""

    @classmethod
    def parse(cls, value: str, flag: str | None = None) -> Self:
        """The member named `value`; else an error naming `flag` (a CLI flag), or the kind of
        mode, and every valid name."""
        try:
            return cls(value)
        except ValueError:
            what = flag or f"unknown {cls.__name__.lower()}"
            raise CisrankError(f"{what} {value!r}: use one of {', '.join(cls)}") from None


class Arrangement(_Mode):
    """How `ContextAssembler` orders the top-K passages (input order = the reranker's, best first).

    ranked, reverse and edges are fixed orders; pmi_rotation, likelihood_select and curvature are
    searched by the question likelihood of candidate prompts (see `cisrank.context.assemble`).
    """

    RANKED = "ranked"
    REVERSE = "reverse"
    EDGES = "edges"
    PMI_ROTATION = "pmi_rotation"
    LIKELIHOOD_SELECT = "likelihood_select"
    CURVATURE = "curvature"

    @property
    def scored(self) -> bool:
        """Whether the order is searched by scoring candidate prompts (the others cost nothing)."""
        return self in (
            Arrangement.PMI_ROTATION,
            Arrangement.LIKELIHOOD_SELECT,
            Arrangement.CURVATURE,
        )


class Decoding(_Mode):
    """How `EnsembleDecoder` decodes: `naive` (every passage in one prompt) or one of the
    document-parallel ensembles (one row per passage; see `cisrank.context.decoding`)."""

    NAIVE = "naive"
    AVG_ENS = "avg_ens"
    REPLUG = "replug"
    LEENS = "leens"
    CLEHE = "clehe"

    @property
    def ensemble(self) -> bool:
        """Whether it merges document-parallel rows (all but `naive`)."""
        return self is not Decoding.NAIVE


_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}
_NOUNS = {"shuffles": "the number of shuffles", "replug_temperature": "the RePlug temperature"}
"""What the range message calls a field of a context config (default: its name)."""


class _ContextConfig(ComponentConfig):
    """Base of the context configs: a value out of its range is one plain sentence naming it
    ("tau must be > 0, got 0.0"), as the library, the CLI and their tests have always said."""

    @field_validator("*", mode="before")
    @classmethod
    def _parse_modes(cls, value: Any, info: ValidationInfo) -> Any:
        """A mode field given a string (a flag's, a JSON body's) gets its member, or an error
        naming every valid one (`_Mode.parse`)."""
        mode = cls.model_fields[info.field_name].annotation if info.field_name else None
        if isinstance(value, str) and isinstance(mode, type) and issubclass(mode, _Mode):
            return mode.parse(value)
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _range_errors(cls, data: Any, handler: Any) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            bound = _BOUNDS.get(first["type"])
            limit = (first.get("ctx") or {}).get(bound[0]) if bound else None
            if bound is None or limit is None or not first["loc"]:
                raise  # the config's usual report (`ComponentConfig.replace`)
            field = str(first["loc"][0])
            raise CisrankError(
                f"{_NOUNS.get(field, field)} must be {bound[1]} {limit:g}, got {first['input']}"
            ) from None


class AssemblerConfig(_ContextConfig):
    """How `ContextAssembler` renders a prompt (`cisrank context`, `/v1/context`)."""

    label: ClassVar[str] = "context assembler"

    template: str = Field(
        default="qa",
        description="qa, noise, kv, entropy, or a custom string holding {documents} and "
        "{question}.",
    )
    fields: dict[str, str] = Field(
        default_factory=dict, description="Values of a custom template's other fields."
    )
    document: str | None = Field(
        default=None,
        description="Passage format with {index}, {title}, {text}, {id} (default the "
        "template's: 'Document [{index}](Title: {title}) {text}').",
    )
    chat: bool = Field(
        default=False, description="Wrap the prompt in the tokenizer's chat template."
    )


class GenerationAssemblerConfig(AssemblerConfig):
    """How generation renders its prompts (`cisrank generate`, `/v1/generate`): as
    `AssemblerConfig`, with the naive and per-document prompts of "Entropy-Based Decoding for
    Retrieval-Augmented Large Language Models" (App. A.3) by default."""

    label: ClassVar[str] = "generation assembler"

    template: str = Field(
        default="entropy",
        description="entropy ('Write a high-quality answer for the given question using only "
        "the provided search results', the prompt of Entropy-Based Decoding, Qiu et al. 2025), "
        "qa, noise, kv, or a custom string holding {documents} and {question}.",
    )


class ArrangeConfig(_ContextConfig):
    """Which order of the passages a context (or a naive generation) uses, and its search."""

    label: ClassVar[str] = "arrangement"

    arrange: Arrangement = Field(
        default=Arrangement.RANKED,
        description="ranked, reverse (best next to the question), edges, pmi_rotation, "
        "likelihood_select or curvature.",
    )
    shuffles: int | None = Field(
        default=None, ge=0, description="likelihood_select: random shuffles (default K-1)."
    )
    seed: int = Field(default=0, description="Seed of likelihood_select's shuffles.")


class DecoderConfig(_ContextConfig):
    """How `EnsembleDecoder` answers: the decoding, its hyperparameters and the answer's length.

    tau and beta default to the values "Entropy-Based Decoding for Retrieval-Augmented Large
    Language Models" chose for Llama-3-8B (§4, Implementation Details: tau 0.25, beta 0.25).
    """

    label: ClassVar[str] = "decoder"

    decoding: Decoding = Field(
        default=Decoding.NAIVE,
        description="naive (all passages in one prompt), avg_ens, replug (weights from the "
        "reranker scores), leens or clehe.",
    )
    tau: float = Field(default=0.25, gt=0, description="LeEns/CLeHe entropy temperature.")
    beta: float = Field(default=0.25, ge=0, description="CLeHe contrast strength.")
    layers: tuple[int, ...] | None = Field(
        default=None,
        description="CLeHe candidate layers (default: even layers of the last half).",
    )
    replug_temperature: float = Field(
        default=1.0, gt=0, description="replug: T of softmax(score / T)."
    )
    max_new_tokens: int = Field(default=32, ge=1, description="Most tokens to generate.")
