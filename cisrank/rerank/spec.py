"""A reranker named in a file: `{kind, model, options}`, the entries of a server config's
`rerankers` and of `cisrank eval rag --rerankers FILE`.

Why here and not in `cisrank.api`: a served reranker and an evaluated one are the same thing
written the same way, so one schema serves both, and it sits on the rerankers' floor where eval
(below the API) can read it. A spec is checked against the registry's kind configs when it is
made, before any model loads; `load` builds it (a registry kind, on worker processes where asked, or a
`module:factory` import path).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from cisrank.config import ComponentConfig, read_config_file, validation_problem
from cisrank.errors import CisrankError
from cisrank.rerank.base import Reranker
from cisrank.rerank.registry import (
    RerankerKind,
    check_options,
    factory_path,
    kind_list,
    kind_of,
    servable,
)

if TYPE_CHECKING:
    from cisrank.jobs.pool import WorkerOptions


class RerankerSpec(ComponentConfig):
    """One served reranker: a registry kind (or `module:factory`), its model and options."""

    # Checked once, when it is made (read from a file, from the CLI's flags or in code): the
    # kind against the registry and the options against its config, without loading a model or
    # torch. A bad spec is a `ValidationError` naming the field (`kind`, `model` or `options`).

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
        "take seconds; one for the encoders; one on a GPU. With `cisrank serve --workers N` "
        "(N HTTP processes, each with its own rerankers), set it to cores / N.",
    )
    threads_per_worker: int | None = Field(
        default=None, ge=1, description="Torch threads of each of those processes (default 1)."
    )

    @model_validator(mode="wrap")
    @classmethod
    def _checked(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> RerankerSpec:
        spec = handler(data)
        problem = spec._problem()
        if problem is None:
            return spec
        field, message = problem
        error = PydanticCustomError("reranker_spec", "{problem}", {"problem": message})
        raise ValidationError.from_exception_data(
            cls.__name__, [InitErrorDetails(type=error, loc=(field,), input=data)]
        )

    @property
    def factory(self) -> bool:
        """Whether `kind` is a `module:factory` import path rather than a registry kind."""
        return factory_path(self.kind)

    @property
    def record(self) -> RerankerKind[Any, Any] | None:
        """The registry's record of the kind; None for a `module:factory`, which declares
        nothing beyond what the reranker it builds declares."""
        return None if self.factory else kind_of(self.kind)

    @property
    def keeps_order(self) -> bool:
        """Whether it restates the input order (kind `none`): nothing to score."""
        return self.record is not None and self.record.keeps_order

    def _problem(self) -> tuple[str, str] | None:
        """The field at fault and what is wrong with it: a kind the registry does not know,
        options its config does not take or accept. A fusing kind's options are its own and
        its parts', which it routes itself when built; a factory's are its own."""
        if self.factory:
            return None
        try:
            record = kind_of(self.kind)
        except CisrankError as exc:
            return "kind", str(exc)
        if record.keeps_order:
            if self.model is not None or self.options:
                return "model", f"reranker '{record.name}' keeps the input order: no model"
            return None
        model = {"model": self.model} if self.model is not None else {}
        if "model" not in record.fields:
            model = {}
        try:
            check_options(self.kind, {**model, **self.options})
        except CisrankError as exc:
            return "options", str(exc)
        return None

    def load(self, workers: WorkerOptions | None = None) -> Reranker:
        """The reranker: a registry kind on `workers` (`load_on_workers`), or what a
        `module:factory` builds (in this process, as `factory(model, **options)`)."""
        if not self.factory:
            from cisrank.rerank.pooled import load_on_workers

            return load_on_workers(self.kind, self.model, workers, **self.options)
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


def parse_specs(
    data: Any, source: str, only: Sequence[str] | None = None
) -> dict[str, RerankerSpec]:
    """`{name: {kind, model?, options?, ...}}` as specs, each checked as it is made,
    or only the entries named in `only` (the others are not read); errors are one line naming
    `source` and the entry."""
    if not isinstance(data, Mapping) or not data:
        raise CisrankError(f"{source}: expected an object {{name: {{kind, model, options}}}}")
    if only is not None:
        missing = [name for name in only if name not in data]
        if missing:
            raise CisrankError(
                f"{source} has no reranker {', '.join(missing)}: it names {', '.join(data)}"
            )
        data = {name: entry for name, entry in data.items() if name in only}
    out: dict[str, RerankerSpec] = {}
    for name, entry in data.items():
        try:
            spec = RerankerSpec.model_validate(entry)
        except ValidationError as exc:
            raise CisrankError(f"{source}: {name}.{validation_problem(exc)}") from None
        out[str(name)] = spec
    return out


def read_specs(
    paths: str | Path | Sequence[str | Path], only: Sequence[str] | None = None
) -> dict[str, RerankerSpec]:
    """The rerankers of one or more JSON or YAML files in the shape of a server config's
    `rerankers` (`{name: {kind, model, options}}`), or those of them named in `only`; a server
    config itself (with a `rerankers` key) is read too, so one file can describe what is served
    and what is evaluated. A name in several files must name the same reranker."""
    files = [paths] if isinstance(paths, str | Path) else list(paths)
    merged: dict[str, Any] = {}
    for path in files:
        data = read_config_file(path, "rerankers file")
        if isinstance(data, Mapping) and isinstance(data.get("rerankers"), Mapping):
            data = data["rerankers"]
        if not isinstance(data, Mapping) or not data:
            raise CisrankError(f"{path}: expected an object {{name: {{kind, model, options}}}}")
        for name, entry in data.items():
            if name in merged and merged[name] != entry:
                raise CisrankError(f"{path}: {name} is another reranker in an earlier file")
            merged[name] = entry
    return parse_specs(merged, ", ".join(str(p) for p in files), only)
