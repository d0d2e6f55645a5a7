"""Rerankers by name, one `RerankerKind` record each, so the CLI, the API config and eval build
them the same way.

A record's config class is imported with the registry (configs hold no model code), so options are
checked, and the CLI's flags built, before a model library loads; its reranker class is imported
only when one is built (`load_class`), so `cisrank eval --reranker none` never imports torch and an
optional backend fails with the extra to install, not at import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from cisrank.config import ComponentConfig, flag_fields, flag_name
from cisrank.errors import CisrankError, UnknownRerankerError
from cisrank.rerank.base import IdentityReranker, Reranker
from cisrank.rerank.configs import (
    CISRerankerConfig,
    CrossEncoderRerankerConfig,
    DenseRerankerConfig,
    HybridRerankerConfig,
    StudentRerankerConfig,
)

ConfigT = TypeVar("ConfigT", bound=ComponentConfig)
ConfigT_contra = TypeVar("ConfigT_contra", bound=ComponentConfig, contravariant=True)


class RerankerClass(Protocol[ConfigT_contra]):
    """The one constructor shape of every reranker: `XReranker(model, *, config=None, **options)`,
    the options being the config's fields. Kinds may take more keyword-only resources (CIS a loaded
    `engine` and an open `prior_store`, the hybrid its `components` and `parts`)."""

    def __call__(
        self, model: str | None = None, *, config: ConfigT_contra | None = None, **options: Any
    ) -> Reranker: ...


@dataclass(frozen=True)
class RerankerKind(Generic[ConfigT]):
    """What cisrank knows about one kind of reranker. A new kind is its config in `configs`, its
    class and one record here: the CLI's flags, option checks and served names follow from them."""

    name: str
    summary: str
    """A few words, for the CLI's help (short enough for an 80-column panel title)."""
    config: type[ConfigT]
    load_class: Callable[[], RerankerClass[ConfigT]]
    """Imports the reranker class (a static import inside a function, which import-linter sees)."""
    fuses: bool = False
    """Its options are its own and those of the kinds it fuses, which it routes itself: it gets
    the registry as `parts` to build them, and its options are not checked here."""

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(self.config.model_fields)

    def build(self, model: str | None, options: Mapping[str, Any]) -> Reranker:
        if self.fuses:
            return self.load_class()(model, parts=_PARTS, **options)
        _check_options(self, options)
        return self.load_class()(model, **options)


def _dense() -> RerankerClass[DenseRerankerConfig]:
    from cisrank.rerank.dense import DenseReranker

    return DenseReranker


def _cis() -> RerankerClass[CISRerankerConfig]:
    from cisrank.rerank.cis import CISReranker

    return CISReranker


def _cross_encoder() -> RerankerClass[CrossEncoderRerankerConfig]:
    from cisrank.rerank.cross_encoder import CrossEncoderReranker

    return CrossEncoderReranker


def _student() -> RerankerClass[StudentRerankerConfig]:
    from cisrank.rerank.cross_encoder import StudentReranker

    return StudentReranker


def _hybrid() -> RerankerClass[HybridRerankerConfig]:
    from cisrank.rerank.hybrid import HybridReranker

    return HybridReranker


KINDS: dict[str, RerankerKind[Any]] = {
    k.name: k
    for k in (
        RerankerKind(
            "cis",
            "causal relevance, log p(K|Q) - log p(K) under a causal LM",
            CISRerankerConfig,
            _cis,
        ),
        RerankerKind(
            "cross-encoder",
            "one logit per (query, passage) pair",
            CrossEncoderRerankerConfig,
            _cross_encoder,
        ),
        RerankerKind(
            "dense",
            "cosine of bi-encoder embeddings",
            DenseRerankerConfig,
            _dense,
        ),
        RerankerKind(
            "student",
            "the cross-encoder shipped with cisrank (DL19 0.6477)",
            StudentRerankerConfig,
            _student,
        ),
        RerankerKind(
            "hybrid",
            "per-query fusion of rerankers and the first stage",
            HybridRerankerConfig,
            _hybrid,
            fuses=True,
        ),
    )
}
"""Every reranker kind, in the one place that lists them."""

NO_RERANKER = "none"


def available() -> list[str]:
    return [NO_RERANKER, *sorted(KINDS)]


def check_name(name: str) -> str:
    if name != NO_RERANKER and name not in KINDS:
        raise UnknownRerankerError(
            f"unknown reranker '{name}': choose one of {', '.join(available())}"
        )
    return name


def config_fields(name: str) -> frozenset[str]:
    """The options reranker kind `name` takes (its config's fields; `none` takes none)."""
    if check_name(name) == NO_RERANKER:
        return frozenset()
    return KINDS[name].fields


def default_model(name: str) -> str | None:
    """The model kind `name` loads when none is named (its config's default), or None for a
    kind without one of its own (`none`, a fusion of other kinds)."""
    if check_name(name) == NO_RERANKER:
        return None
    field = KINDS[name].config.model_fields.get("model")
    default = field.default if field is not None else None
    return default if isinstance(default, str) else None


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Options for kind `name`, checked as building it would check them but without loading
    a model (or torch): unknown ones named with their owner, values against the kind's config;
    a fusing kind's options against its own config and the kinds it may fuse. None values
    mean "the default" and are skipped. For checks before a server starts."""
    given = {k: v for k, v in options.items() if v is not None}
    if check_name(name) == NO_RERANKER or not given:
        return
    kind = KINDS[name]
    if not kind.fuses:
        _check_options(kind, given)
        kind.config().replace(**given)
        return
    own = {k: v for k, v in given.items() if k in kind.fields}
    kind.config().replace(**own)
    others = set(given) - set(own)
    fusable = frozenset().union(*(k.fields for k in KINDS.values() if not k.fuses))
    stray = sorted(others - fusable)
    if stray:
        raise CisrankError(
            f"{', '.join(map(flag_name, stray))}: not options of {name} or of a kind it fuses"
        )


def _check_options(kind: RerankerKind[Any], options: Mapping[str, Any]) -> None:
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
    which takes no model and ignores the options the CLI passes to every reranker. Options that
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
    check_name(name)
    if name == NO_RERANKER:
        return IdentityReranker()
    return KINDS[name].build(model, {k: v for k, v in options.items() if v is not None})


class _Parts:
    """The registry as a fusing reranker sees it (`hybrid.Parts`)."""

    def fields(self, kind: str) -> frozenset[str]:
        return config_fields(kind)

    def load(self, kind: str, model: str | None, options: Mapping[str, Any]) -> Reranker:
        return load_reranker(kind, model, **options)


_PARTS = _Parts()
