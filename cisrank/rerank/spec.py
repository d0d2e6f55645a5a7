"""A reranker named in a file: `{kind, model, options}`, the entries of a server config's
`rerankers` and of `cisrank eval rag --rerankers FILE`.

Why here and not in `cisrank.api`: a served reranker and an evaluated one are the same thing
written the same way, so one schema serves both, and it sits on the rerankers' floor where eval
(below the API) can read it. `check` tests a spec against the registry's kind configs before any
model loads; `load` builds it (a registry kind, on worker processes where asked, or a
`module:factory` import path).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError

from cisrank.config import ComponentConfig, read_config_file, validation_problem
from cisrank.errors import CisrankError
from cisrank.rerank.base import Reranker

if TYPE_CHECKING:
    from cisrank.workers import WorkerOptions


class RerankerSpec(ComponentConfig):
    """One served reranker: a registry kind (or `module:factory`), its model and options."""

    kind: str = Field(
        description="A reranker kind (cis, cross-encoder, dense, hybrid, student: the "
        "cross-encoder shipped with cisrank), or an import path 'package.module:factory' for a "
        "custom reranker factory called as factory(model, **options)."
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
        "the model (`cisrank.workers`): one request's passages are shared among them. Default: "
        "one per CPU core for the causal-LM kinds (cis, hybrid), whose 100-passage requests "
        "take seconds; one for the encoders; one on a GPU. With `cisrank serve --workers N` "
        "(N HTTP processes, each with its own rerankers), set it to cores / N.",
    )
    threads_per_worker: int | None = Field(
        default=None, ge=1, description="Torch threads of each of those processes (default 1)."
    )

    @property
    def factory(self) -> bool:
        """Whether `kind` is a `module:factory` import path rather than a registry kind."""
        return ":" in self.kind

    def check(self) -> None:
        """Refuse, before any model loads, a kind the registry does not know and options its
        config does not take or accept (one line naming them). A fusing kind's options are its
        own and its parts', which it routes itself when built; a factory's are its own."""
        from cisrank.rerank.registry import KINDS, NO_RERANKER, check_name, check_options

        if self.factory:
            return
        check_name(self.kind)
        if self.kind == NO_RERANKER:
            if self.model is not None or self.options:
                raise CisrankError(f"reranker '{NO_RERANKER}' keeps the input order: no model")
            return
        model = {"model": self.model} if self.model is not None else {}
        if "model" not in KINDS[self.kind].fields:
            model = {}
        check_options(self.kind, {**model, **self.options})

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
    """`{name: {kind, model?, options?, ...}}` as specs, each checked (`RerankerSpec.check`),
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
        try:
            spec.check()
        except CisrankError as exc:
            raise CisrankError(f"{source}: {name}: {exc}") from None
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
