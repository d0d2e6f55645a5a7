"""Typed settings: one object per component, filled from CLI flags, a config file or tests alike.

Every component (each reranker, each index kind, training) declares a `ComponentConfig` subclass
next to its code (the rerankers' in `cisrank.rerank.configs`, apart from the torch code, so the CLI
builds its flags from them without loading a model library); defaults live there and only there,
and callers pass overrides where None means "keep the default". Process-wide `CISRANK_*`
environment variables are read in `cisrank.env`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from cisrank.errors import CisrankError


class ComponentConfig(BaseModel):
    """Base of every component config: strict about unknown keys so typos fail loudly."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    label: ClassVar[str] = "component"
    """What error messages call the component ("CIS reranker", ...)."""

    def replace(self, **changes: Any) -> Self:
        """A validated copy with the non-None `changes` applied (None means "keep"): constructors
        take keyword overrides from the CLI, the API config and tests, and all of them get one-line
        errors naming the option, never a pydantic traceback."""
        unknown = sorted(set(changes) - set(type(self).model_fields))
        if unknown:
            raise CisrankError(
                f"unknown {self.label} option(s): {', '.join(unknown)}; "
                f"valid: {', '.join(type(self).model_fields)}"
            )
        merged = {**self.model_dump(), **{k: v for k, v in changes.items() if v is not None}}
        try:
            return type(self).model_validate(merged)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            raise CisrankError(f"{self.label} options: {problems}") from None


@dataclass(frozen=True)
class Flag:
    """Marks a config field as a command-line flag: `field: Annotated[T, Flag()] = Field(...)`.

    The CLI generates one flag per marked field (`--max-doc-tokens` for `max_doc_tokens`), its
    help from the field's description and default, so a flag is declared where its default is.
    Fields left unmarked are set through a config file, the API's reranker options or code.
    """

    path: bool = False
    """The value names files: parsed as a path on the command line, as it always was (so a
    recorded option, such as a teacher's prior store, reads the same on a resumed run)."""


def flag_fields(config: type[BaseModel]) -> dict[str, Flag]:
    """The fields of `config` marked `Flag()`, with their marks, in field order."""
    marked = {
        name: [m for m in info.metadata if isinstance(m, Flag)]
        for name, info in config.model_fields.items()
    }
    return {name: marks[0] for name, marks in marked.items() if marks}


def flag_name(field: str) -> str:
    """The command-line flag of a config field: `--max-doc-tokens` for `max_doc_tokens`."""
    return "--" + field.replace("_", "-")


def read_config_file(path: str | Path, what: str) -> Any:
    """The data of a JSON (or, with PyYAML installed, YAML) config file; a missing file or one
    that does not parse is one line naming the file (`what` says what it should hold). It is
    read as the API reads a body: at most `MAX_JSON_LINE_BYTES` (16 MiB), UTF-8 (a bad byte
    named by line and column), at most `MAX_JSON_DEPTH` levels of nesting and integers Python
    converts (`guarded_json`: a RecursionError and a ValueError traceback before)."""
    from cisrank.data.datasets import MAX_JSON_LINE_BYTES, check_depth, guarded_json

    path = Path(path)
    if not path.is_file():
        raise CisrankError(f"{what} '{path}' does not exist")
    with path.open("rb") as f:
        raw = f.read(MAX_JSON_LINE_BYTES + 1)
    if len(raw) > MAX_JSON_LINE_BYTES:
        raise CisrankError(f"{path}: over {MAX_JSON_LINE_BYTES:,} bytes, the limit of a {what}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start].decode("utf-8", "replace")
        line, column = before.count("\n") + 1, len(before) - before.rfind("\n")
        raise CisrankError(
            f"{path}:{line}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column {column}): give "
            f"the {what} as UTF-8"
        ) from None
    yaml_file = path.suffix.lower() in {".yaml", ".yml"}
    if not yaml_file:
        return guarded_json(text, f"{path}: not valid JSON")
    try:
        import yaml
    except ImportError:
        raise CisrankError(
            f"{path}: reading YAML needs PyYAML (pip install pyyaml), or use JSON"
        ) from None
    try:
        data = yaml.safe_load(text)
    except Exception as exc:  # yaml.YAMLError; RecursionError, ValueError (a long integer)
        why = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
        raise CisrankError(f"{path}: not valid YAML: {why or type(exc).__name__}") from None
    check_depth(data, f"{path}: not valid YAML")
    return data


def validation_problem(exc: ValidationError) -> str:
    """The first problem of a pydantic error as `where: what` (the field's dotted path)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return f"{where}: {first['msg']}"
