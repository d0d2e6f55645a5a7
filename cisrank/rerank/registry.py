"""Rerankers by name, one `RerankerKind` record each, so the CLI, the API config and eval build
them the same way.

A record's config class is imported with the registry (configs hold no model code), so options are
checked, and the CLI's flags built, before a model library loads; its reranker class is imported
only when one is built (`load_class`), so `cisrank eval --reranker none` never imports torch and an
optional backend fails with the extra to install, not at import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from cisrank.config import ComponentConfig, flag_fields, flag_name
from cisrank.errors import CisrankError, UnknownRerankerError
from cisrank.rerank.base import IdentityReranker, Reranker
from cisrank.rerank.configs import (
    CISRerankerConfig,
    CrossEncoderRerankerConfig,
    DenseRerankerConfig,
    HybridRerankerConfig,
    NoRerankerConfig,
    StudentRerankerConfig,
    reverse_only,
)

if TYPE_CHECKING:
    from cisrank.rerank.cis import CISReranker
    from cisrank.rerank.cross_encoder import CrossEncoderReranker, StudentReranker
    from cisrank.rerank.dense import DenseReranker
    from cisrank.rerank.hybrid import HybridReranker

ConfigT = TypeVar("ConfigT", bound=ComponentConfig)
ConfigT_contra = TypeVar("ConfigT_contra", bound=ComponentConfig, contravariant=True)
RerankerT = TypeVar("RerankerT", bound=Reranker)
RerankerT_co = TypeVar("RerankerT_co", bound=Reranker, covariant=True)


class RerankerClass(Protocol[ConfigT_contra, RerankerT_co]):
    """The one constructor shape of every reranker: `XReranker(model, *, config=None, **options)`,
    the options being the config's fields. Kinds may take more keyword-only resources (CIS a loaded
    `engine` and an open `prior_store`, the hybrid its `components` and `parts`)."""

    def __call__(
        self, model: str | None = None, *, config: ConfigT_contra | None = None, **options: Any
    ) -> RerankerT_co: ...


def _never(config: Any) -> bool:
    return False


def _always(config: Any) -> bool:
    return True


@dataclass(frozen=True)
class RerankerKind(Generic[ConfigT, RerankerT]):
    """What cisrank knows about one kind of reranker, and the only place it is known: every
    question a caller asks of a kind (may it be served? does it run a causal LM? is it cheaper
    scored passage by passage?) is a field here, never a test of its name or of its class. A new
    kind is its config in `configs`, its class and one record here: the CLI's flags, option
    checks, served names, help texts and teachers follow from them."""

    name: str
    summary: str
    """A few words, for the CLI's help (short enough for an 80-column panel title)."""
    config: type[ConfigT]
    load_class: Callable[[], RerankerClass[ConfigT, RerankerT]]
    """Imports the reranker class (a static import inside a function, which import-linter sees)."""
    fuses: bool = False
    """Its options are its own and those of the kinds it fuses, which it routes itself: it gets
    the registry as `parts` to build them, and its options are not checked here."""
    causal_lm: bool = False
    """Its scores run a causal LM, so a 100-passage request takes seconds on a CPU: a server
    gives it a worker per core unless its spec says otherwise (an encoder scores a request in
    milliseconds, and a worker's round trip would cost more than it saves)."""
    embeds: bool = False
    """Its model is a bi-encoder that embeds texts (its rerankers declare an `embedder`):
    `/v1/embeddings` serves it."""
    servable: bool = True
    """Whether `cisrank serve` may serve it (not `none`, which scores nothing)."""
    keeps_order: bool = False
    """It restates the input order (`none`): it takes no model and ignores the options the CLI
    passes to whichever kind is chosen, and it cannot teach (it has no scores)."""
    passage_major: Callable[[ConfigT], bool] = _never
    """Whether, with this config, scoring a passage's queries together saves work (its
    rerankers' `passage_major`): jobs that score a pool then cut their shards by passage."""
    gloss: str = ""
    """A few words said after its name where the kinds are listed (what the student is)."""
    estimate_fields: frozenset[str] = frozenset()
    """Options that only combine the sums its model computes (its config's `sides` and
    `estimate`, its rerankers' `parts_batch`): settings that differ in these alone share one
    pass of the model (`cisrank eval rag` over a grid of CIS settings)."""

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(self.config.model_fields)

    def build(self, model: str | None, options: Mapping[str, Any]) -> RerankerT:
        if self.keeps_order:
            return self.load_class()(model)
        if self.fuses:
            return self.load_class()(model, parts=_PARTS, **options)
        _check_options(self, options)
        return self.load_class()(model, **options)

    def passage_major_with(self, options: Mapping[str, Any]) -> bool:
        """`passage_major` of the reranker these options build, without building it. A fusing
        kind combines each whole request, which passage shards would cut apart: never."""
        if self.fuses or self.keeps_order:
            return False
        own = {k: v for k, v in options.items() if k in self.fields and v is not None}
        return self.passage_major(self.config().replace(**own))


def _identity() -> RerankerClass[NoRerankerConfig, IdentityReranker]:
    return IdentityReranker


def _dense() -> RerankerClass[DenseRerankerConfig, DenseReranker]:
    from cisrank.rerank.dense import DenseReranker

    return DenseReranker


def _cis() -> RerankerClass[CISRerankerConfig, CISReranker]:
    from cisrank.rerank.cis import CISReranker

    return CISReranker


def _cross_encoder() -> RerankerClass[CrossEncoderRerankerConfig, CrossEncoderReranker]:
    from cisrank.rerank.cross_encoder import CrossEncoderReranker

    return CrossEncoderReranker


def _student() -> RerankerClass[StudentRerankerConfig, StudentReranker]:
    from cisrank.rerank.cross_encoder import StudentReranker

    return StudentReranker


def _hybrid() -> RerankerClass[HybridRerankerConfig, HybridReranker]:
    from cisrank.rerank.hybrid import HybridReranker

    return HybridReranker


CIS: RerankerKind[CISRerankerConfig, CISReranker] = RerankerKind(
    "cis",
    "causal relevance, log p(K|Q) - log p(K) under a causal LM",
    CISRerankerConfig,
    _cis,
    causal_lm=True,
    passage_major=reverse_only,
    estimate_fields=CISRerankerConfig.ESTIMATE_FIELDS,
)
CROSS_ENCODER: RerankerKind[CrossEncoderRerankerConfig, CrossEncoderReranker] = RerankerKind(
    "cross-encoder",
    "one logit per (query, passage) pair",
    CrossEncoderRerankerConfig,
    _cross_encoder,
)
"""Also the kind a student trained by `cisrank distill train` is loaded as (a folder)."""
DENSE: RerankerKind[DenseRerankerConfig, DenseReranker] = RerankerKind(
    "dense",
    "cosine of bi-encoder embeddings",
    DenseRerankerConfig,
    _dense,
    embeds=True,
    passage_major=_always,  # a passage is embedded once for all its queries
)
"""Also the kind a bi-encoder student (`distill train --student bi`) is loaded as."""
NONE: RerankerKind[NoRerankerConfig, IdentityReranker] = RerankerKind(
    "none",
    "keep the first stage's order",
    NoRerankerConfig,
    _identity,
    servable=False,
    keeps_order=True,
)

KINDS: dict[str, RerankerKind[Any, Any]] = {
    k.name: k
    for k in (
        CIS,
        CROSS_ENCODER,
        DENSE,
        RerankerKind(
            "student",
            "the cross-encoder shipped with cisrank (DL19 0.6458)",
            StudentRerankerConfig,
            _student,
            gloss="the cross-encoder shipped with cisrank",
        ),
        RerankerKind(
            "hybrid",
            "per-query fusion of rerankers and the first stage",
            HybridRerankerConfig,
            _hybrid,
            fuses=True,
            causal_lm=True,  # its default fusion holds CIS
        ),
    )
}
"""Every reranker kind that scores, in the one place that lists them; `NONE` apart."""

NO_RERANKER = NONE.name


def available() -> list[str]:
    return [NO_RERANKER, *sorted(KINDS)]


def kind_of(name: str) -> RerankerKind[Any, Any]:
    """The record of kind `name` (`none` included); an `UnknownRerankerError` naming the
    kinds there are for any other name."""
    found = NONE if name == NONE.name else KINDS.get(name)
    if found is None:
        raise UnknownRerankerError(
            f"unknown reranker '{name}': choose one of {', '.join(available())}"
        )
    return found


def factory_path(name: str) -> bool:
    """Whether a reranker spec's kind is a `package.module:factory` import path (built by
    calling it) rather than a kind of this registry: no kind's name holds a colon."""
    return ":" in name


def check_name(name: str) -> str:
    kind_of(name)
    return name


def kind_list(kinds: Iterable[RerankerKind[Any, Any]]) -> str:
    """Kinds as the help texts list them: by name, sorted, each with its gloss where it has
    one (`student: the cross-encoder shipped with cisrank`)."""
    return ", ".join(
        f"{k.name}: {k.gloss}" if k.gloss else k.name for k in sorted(kinds, key=lambda k: k.name)
    )


def servable() -> list[RerankerKind[Any, Any]]:
    """The kinds `cisrank serve` may serve, sorted by name."""
    return sorted((k for k in (NONE, *KINDS.values()) if k.servable), key=lambda k: k.name)


def config_fields(name: str) -> frozenset[str]:
    """The options reranker kind `name` takes (its config's fields; `none` takes none)."""
    return kind_of(name).fields


def default_model(name: str) -> str | None:
    """The model kind `name` loads when none is named (its config's default), or None for a
    kind without one of its own (`none`, a fusion of other kinds)."""
    field = kind_of(name).config.model_fields.get("model")
    default = field.default if field is not None else None
    return default if isinstance(default, str) else None


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Options for kind `name`, checked as building it would check them but without loading
    a model (or torch): unknown ones named with their owner, values against the kind's config;
    a fusing kind's options against its own config and the kinds it may fuse. None values
    mean "the default" and are skipped. For checks before a server starts."""
    given = {k: v for k, v in options.items() if v is not None}
    record = kind_of(name)
    if record.keeps_order or not given:
        return
    if not record.fuses:
        _check_options(record, given)
        record.config().replace(**given)
        return
    own = {k: v for k, v in given.items() if k in record.fields}
    record.config().replace(**own)
    others = set(given) - set(own)
    fusable = frozenset().union(*(k.fields for k in KINDS.values() if not k.fuses))
    stray = sorted(others - fusable)
    if stray:
        raise CisrankError(
            f"{', '.join(map(flag_name, stray))}: not options of {name} or of a kind it fuses"
        )


def _check_options(kind: RerankerKind[Any, Any], options: Mapping[str, Any]) -> None:
    """Reject the flags of another reranker by their flag names (`--template` given to dense),
    saying whose they are: the CLI passes every reranker-specific flag to whichever is chosen."""
    unknown = sorted(set(options) - kind.fields)
    if not unknown:
        return
    flags = ", ".join(map(flag_name, unknown))
    owner = next(
        (k.name for k in KINDS.values() if k is not kind and set(unknown) <= k.fields),
        None,
    )
    whose = f"option(s) of the {owner} reranker, not of {kind.name}" if owner else "not options"
    own = ", ".join(map(flag_name, flag_fields(kind.config)))
    takes = f"{kind.name} takes {own}" if own else f"{kind.name} takes no flag of its own"
    raise CisrankError(f"{flags}: {whose}; drop them ({takes})")


def load_reranker(name: str, model: str | None = None, **options: Any) -> Reranker:
    """Build the named reranker; `none` gives the `IdentityReranker` (keep the input order),
    which takes no model and ignores the options the CLI passes to every reranker (its record
    `keeps_order`). Options that
    are None mean "the config's default" and are dropped, as the CLI passes every flag."""
    if not isinstance(name, str):  # a list or None would be a TypeError deep in a dict lookup
        raise UnknownRerankerError(
            f"load_reranker: the kind is one name, a string ({', '.join(available())}), "
            f"not {type(name).__name__} {name!r:.60}"
        )
    if model is not None and not isinstance(model, str):
        if not isinstance(model, os.PathLike):
            raise CisrankError(
                f"load_reranker: model is a name or a folder (a string or a path), not "
                f"{type(model).__name__} {model!r:.60}"
            )
        model = os.fspath(model)
    return kind_of(name).build(model, {k: v for k, v in options.items() if v is not None})


class _Parts:
    """The registry as a fusing reranker sees it (`hybrid.Parts`)."""

    def fields(self, kind: str) -> frozenset[str]:
        return config_fields(kind)

    def load(self, kind: str, model: str | None, options: Mapping[str, Any]) -> Reranker:
        return load_reranker(kind, model, **options)


_PARTS = _Parts()
