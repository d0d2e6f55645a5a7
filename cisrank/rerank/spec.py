"""Rerankers named in a file: `{name: {kind, model, options}}`, the entries of a server config's
`rerankers` and of `cisrank eval rag --rerankers FILE`, each a `RerankerSpec`.

Why here and not in `cisrank.api`: a served reranker and an evaluated one are the same thing
written the same way, so one schema serves both, and it sits on the rerankers' floor where eval
(below the API) can read it. The spec itself lives beside the registry whose records it keeps
(`cisrank.rerank.registry.RerankerSpec`, which `build`s it); this module reads files of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cisrank.config import read_config_file, validation_problem
from cisrank.errors import CisrankError
from cisrank.rerank.registry import RerankerSpec

__all__ = ["RerankerSpec", "parse_specs", "read_specs"]


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
