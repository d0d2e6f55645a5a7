"""Rerankers by name, one `RerankerKind` record each, and the one way to build one, a
`RerankerSpec` (`{kind, model, options}`), so the CLI, the API config, eval and the Python API
build them the same way: a spec looks its kind up once, when it is made, and keeps the record;
`spec.build` makes the reranker (one copy here, on worker processes, or for a server), and
`load_reranker(kind, model, **options)` is `RerankerSpec.of(kind, model, **options).build()`.

A record's config class is imported with the registry (configs hold no model code), so options are
checked, and the CLI's flags built, before a model library loads; its reranker class is imported
only when one is built (`load_class`), so `cisrank eval --reranker none` never imports torch and an
optional backend fails with the extra to install, not at import time.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

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
    from cisrank.jobs.pool import WorkerOptions
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

    @property
    def default_model(self) -> str | None:
        """The model it loads when none is named (its config's default), or None for a kind
        without one of its own (`none`, a fusion of other kinds)."""
        field = self.config.model_fields.get("model")
        default = field.default if field is not None else None
        return default if isinstance(default, str) else None

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Options for this kind, checked as building it would check them but without loading
        a model (or torch): unknown ones named with their owner, values against its config; a
        fusing kind's options against its own config and the kinds it may fuse. None values
        mean "the default" and are skipped."""
        given = {k: v for k, v in options.items() if v is not None}
        if self.keeps_order or not given:
            return
        if not self.fuses:
            _check_options(self, given)
            self.config().replace(**given)
            return
        own = {k: v for k, v in given.items() if k in self.fields}
        self.config().replace(**own)
        others = set(given) - set(own)
        fusable = frozenset().union(*(k.fields for k in KINDS.values() if not k.fuses))
        stray = sorted(others - fusable)
        if stray:
            raise CisrankError(
                f"{', '.join(map(flag_name, stray))}: not options of {self.name} or of a kind "
                "it fuses"
            )

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
    """The model kind `name` loads when none is named (`RerankerKind.default_model`)."""
    return kind_of(name).default_model


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


# ------------------------------------------------------------------ the one way to build one

_FROM_FLAGS = "flags"
"""Validation context of `RerankerSpec.of`: the arguments are the CLI's flags."""


class _Problem(Exception):
    """A spec's field at fault (`kind`, `model`, `options`) and the error that says why."""

    def __init__(self, field: str, error: CisrankError) -> None:
        super().__init__(str(error))
        self.field = field
        self.error = error


class RerankerSpec(ComponentConfig):
    """One reranker: a registry kind (or `module:factory`), its model and options; `build`
    makes it. The entries of a server config's `rerankers`, of `cisrank eval rag --rerankers
    FILE`, the CLI's flags (`of`) and `load_reranker`'s arguments are all specs."""

    # Checked once, when it is made (read from a file, from the CLI's flags or in code): the
    # kind against the registry, whose record it keeps, and the options against its config,
    # without loading a model or torch. A bad spec is a `ValidationError` naming the field
    # (`kind`, `model` or `options`); one made by `of` raises the registry's own error.

    kind: str = Field(
        description=f"A reranker kind ({kind_list(servable())}), or an import path "
        "'package.module:factory' for a custom reranker factory called as "
        "factory(model, **options)."
    )
    model: str | None = Field(
        default=None,
        description="Hugging Face id, local folder or pulled model's name (`cisrank models "
        "list`); the kind's default model when unset.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword options passed to the reranker factory."
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        description="Processes this reranker's model work runs on, each with its own copy of "
        "the model (`cisrank.jobs.pool`): one request's passages are shared among them. Default: "
        "one per CPU core for the causal-LM kinds "
        f"({kind_list(k for k in servable() if k.causal_lm)}), whose 100-passage requests "
        "take seconds; one for the encoders (served: on every core's thread); one on a GPU. "
        "With `cisrank serve --workers N` (N HTTP processes, each with its own rerankers), "
        "set it to cores / N.",
    )
    threads_per_worker: int | None = Field(
        default=None,
        ge=1,
        description="Threads of each of those processes (default 1; a served encoder's one "
        "process: a thread per core).",
    )
    _record: RerankerKind[Any, Any] | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, kind: str, model: str | None = None, **options: Any) -> RerankerSpec:
        """The spec of the CLI's flags and of `load_reranker`'s arguments: options that are None
        mean "the config's default" and are dropped, as the CLI passes every flag; a kind that
        keeps the input order (`none`) takes no model and ignores the options passed to
        whichever kind is chosen. A bad one raises the registry's error (`CisrankError`)."""
        given = {k: v for k, v in options.items() if v is not None}
        data = {"kind": kind, "model": model, "options": given}
        return cls.model_validate(data, context={_FROM_FLAGS: True})

    @model_validator(mode="wrap")
    @classmethod
    def _checked(
        cls, data: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Self:
        spec = handler(data)
        flags = bool(info.context and info.context.get(_FROM_FLAGS))
        try:
            return spec._resolved(flags)
        except _Problem as problem:
            if flags:
                raise problem.error from None
            error = PydanticCustomError("reranker_spec", "{problem}", {"problem": str(problem)})
            raise ValidationError.from_exception_data(
                cls.__name__, [InitErrorDetails(type=error, loc=(problem.field,), input=data)]
            ) from None

    def _resolved(self, flags: bool) -> Self:
        """This spec with its kind's record, looked up once; a `_Problem` for a kind the
        registry does not know, options its config does not take or accept. A fusing kind's
        options are its own and its parts', which it routes itself when built; a factory's
        are its own. A spec made already (one handed to a server config) is kept as it is."""
        if self.factory or self._record is not None:
            return self
        try:
            record = kind_of(self.kind)
        except CisrankError as exc:
            raise _Problem("kind", exc) from None
        spec = self
        if record.keeps_order and flags:
            spec = self.model_copy(update={"model": None, "options": {}})
        elif record.keeps_order and (self.model is not None or self.options):
            why = f"reranker '{record.name}' keeps the input order: no model"
            raise _Problem("model", CisrankError(why))
        elif not record.keeps_order:
            named = self.model is not None and "model" in record.fields
            model = {"model": self.model} if named else {}
            try:
                record.check_options({**model, **self.options})
            except CisrankError as exc:
                raise _Problem("options", exc) from None
        spec._record = record
        return spec

    @property
    def factory(self) -> bool:
        """Whether `kind` is a `module:factory` import path rather than a registry kind."""
        return factory_path(self.kind)

    @property
    def record(self) -> RerankerKind[Any, Any] | None:
        """The registry's record of the kind, kept when the spec was made; None for a
        `module:factory`, which declares nothing beyond what the reranker it builds declares."""
        return self._record

    @property
    def keeps_order(self) -> bool:
        """Whether it restates the input order (kind `none`): nothing to score."""
        return self._record is not None and self._record.keeps_order

    def build(
        self,
        workers: WorkerOptions | None = None,
        *,
        serving: bool = False,
        expected_chars: float | None = None,
    ) -> Reranker:
        """The reranker, from the record the spec keeps (the registry is not asked again).

        `workers`: the processes its model work runs on (a `PooledReranker` beyond one); None:
        one copy in this process, on its threads as they are, or, `serving`, the spec's own
        `workers` and `threads_per_worker`; a default count is `pool`'s. `serving` (a server's
        reranker): its workers start at once (they load before the server is ready), and one
        that scores nothing is refused. Otherwise, where the count is the default, the workers
        start only once they pay for their start on the work left (`cisrank.rerank.pooled`),
        `expected_chars` of (query, passage) pairs in all where the caller knows it. A
        `module:factory` is built in this process."""
        record = self._record
        if record is None:
            reranker = self._from_factory()
        else:
            asked = workers is not None or serving
            pool = self.pool(workers, serving) if asked and not record.keeps_order else None
            if pool is not None and pool.count > 1:
                from cisrank.rerank.pooled import PooledReranker

                lazy = not serving and pool.workers is None
                return PooledReranker(self, pool, when_it_pays=lazy, expected_chars=expected_chars)
            if pool is not None:
                from cisrank.jobs.pool import set_threads

                set_threads(pool.threads_per_worker)
            options = {k: v for k, v in self.options.items() if v is not None}
            if record.fuses:  # it builds the kinds it fuses through the registry
                options["parts"] = _PARTS
            reranker = record.load_class()(self.model, **options)
        if serving and reranker.keeps_order:
            raise CisrankError(
                f"reranker kind '{self.kind}' keeps the input order: it cannot be served"
            )
        return reranker

    def pool(self, workers: WorkerOptions | None, serving: bool) -> WorkerOptions:
        """The processes its model work runs on, decided here only: `workers`, else the spec's
        own; of a default count, one on a GPU (one process fills it) and one for a served
        encoder (it scores a request in milliseconds: a worker's round trip would cost more
        than it saves) on a thread per core unless its threads are given, a worker per core
        otherwise."""
        from cisrank.jobs.pool import WorkerOptions, cores, for_device

        given = workers or WorkerOptions(self.workers, self.threads_per_worker or 1)
        record = self._record
        if given.workers is None and serving and (record is None or not record.causal_lm):
            # one process: every core is its threads' (ONNX int8's lanes, torch's intra-op)
            threads = self.threads_per_worker if workers is None else given.threads_per_worker
            given = WorkerOptions(1, threads or cores())
        return for_device(given, self.options.get("device"))

    def _from_factory(self) -> Reranker:
        """What a `module:factory` builds, as `factory(model, **options)`, in this process."""
        module_name, _, attr = self.kind.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise CisrankError(f"reranker kind '{self.kind}' cannot be imported: {exc}") from exc
        built = factory(self.model, **self.options)
        if not isinstance(built, Reranker):  # callers read the contract's capabilities
            raise CisrankError(
                f"reranker kind '{self.kind}' built a {type(built).__name__}, which is not a "
                "Reranker: subclass cisrank.rerank.base.BaseReranker"
            )
        return built


def load_reranker(name: str, model: str | None = None, **options: Any) -> Reranker:
    """The named reranker, one copy in this process: `RerankerSpec.of(name, model,
    **options).build()`. `none` gives the `IdentityReranker` (keep the input order), which
    takes no model and ignores the options the CLI passes to every reranker. Options that are
    None mean "the config's default" and are dropped, as the CLI passes every flag."""
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
    return RerankerSpec.of(name, model, **options).build()


class _Parts:
    """The registry as a fusing reranker sees it (`hybrid.Parts`)."""

    def fields(self, kind: str) -> frozenset[str]:
        return config_fields(kind)

    def load(self, kind: str, model: str | None, options: Mapping[str, Any]) -> Reranker:
        return load_reranker(kind, model, **options)


_PARTS = _Parts()
