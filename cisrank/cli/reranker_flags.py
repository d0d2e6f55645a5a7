"""The reranker flags of every verb, generated from the reranker configs' `Flag()` fields.

A verb takes `**options` and is decorated with `@reranker_flags(...)`; the decorator puts one
keyword-only `--flag` parameter per marked config field in the signature typer reads, with the
field's description and default as its help, under a panel per reranker kind. The flags arrive in
`options`, None when left out, and go to `load_reranker` (directly or through a teacher) as they
are: there the chosen kind builds its config from them, drops the None ones (its defaults), and
names the owner of a flag that belongs to another kind. So a flag, its help and its default are
declared once, in `cisrank.rerank.configs`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, cast, get_args, get_origin

import typer
from pydantic.fields import FieldInfo

from cisrank.cli.defaults import field_help
from cisrank.cli.help_format import HELP_KIND, KIND_FLAGS, KindFlags, show_kind
from cisrank.config import ComponentConfig, Flag, flag_fields, flag_name
from cisrank.rerank.registry import KINDS

Command = TypeVar("Command", bound=Callable[..., None])


@dataclass(frozen=True)
class RerankerFlag:
    """One generated flag: a config field of one or more reranker kinds."""

    field: str
    kinds: tuple[str, ...]
    config: type[ComponentConfig]
    """The first kind's config, whose description and default the help shows."""
    path: bool

    @property
    def name(self) -> str:
        return flag_name(self.field)

    def panel(self, role: str) -> str:
        """Flags grouped by the kind that takes them, so the help says whose each flag is."""
        if len(self.kinds) > 1:
            return f"--{role} {' | '.join(self.kinds)}"
        return f"--{role} {self.kinds[0]}: {KINDS[self.kinds[0]].summary}"

    def parameter(self, role: str) -> inspect.Parameter:
        info = self.config.model_fields[self.field]
        if is_mapping(info):
            option = typer.Option(
                self.name,
                help=field_help(self.config, self.field) + " As KIND=MODEL,KIND=MODEL.",
                rich_help_panel=self.panel(role),
                callback=_mapping,
            )
            return inspect.Parameter(
                self.field,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[str | None, option],
            )
        if info.annotation is bool:  # --prior / --no-prior; unset keeps the config's default
            option = typer.Option(
                f"{self.name}/--no-{self.name.removeprefix('--')}",
                help=field_help(self.config, self.field),
                rich_help_panel=self.panel(role),
            )
            return inspect.Parameter(
                self.field,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[bool | None, option],
            )
        # Field(ge=..., le=...) as typer's min and max: out of range is the usage error it was.
        bounds = {
            flag: next((getattr(m, bound) for m in info.metadata if hasattr(m, bound)), None)
            for flag, bound in (("min", "ge"), ("max", "le"))
        }
        option = typer.Option(
            self.name,
            help=field_help(self.config, self.field),
            rich_help_panel=self.panel(role),
            # A path is parsed as one (as typer always did) and handed on as the string the
            # config holds.
            callback=_path_string if self.path else None,
            **{k: v for k, v in bounds.items() if v is not None},
        )
        kind = Path if self.path else cli_type(info)
        return inspect.Parameter(
            self.field,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[kind | None, option],
        )


def _path_string(value: Path | None) -> str | None:
    return None if value is None else str(value)


def is_mapping(info: FieldInfo) -> bool:
    """A `dict[str, str]` field (the hybrid's `models`), given on the command line as
    `KEY=VALUE,KEY=VALUE`."""
    return get_origin(info.annotation) is dict


def _mapping(value: str | None) -> dict[str, str] | None:
    if value is None:
        return None
    out: dict[str, str] = {}
    for part in (p.strip() for p in value.split(",")):
        key, sep, item = part.partition("=")
        if not part or not sep or not key.strip() or not item.strip():
            raise typer.BadParameter(f"'{part}': give KEY=VALUE pairs separated by commas")
        out[key.strip()] = item.strip()
    return out


def flaggable(info: FieldInfo) -> bool:
    """Whether a config field can be a flag: str, int, float (a Literal of them, optional or
    not), bool (`--x/--no-x`) or a str mapping."""
    if is_mapping(info) or info.annotation is bool:
        return True
    try:
        cli_type(info)
    except TypeError:
        return False
    return True


def cli_type(info: FieldInfo) -> type:
    """The flag's type: the field's, less None; a Literal's values are checked by the config,
    with its one-line error, so the flag reads text."""
    annotation = info.annotation
    if get_origin(annotation) in (Union, UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is Literal:
        annotation = type(get_args(annotation)[0])
    if annotation not in (str, int, float):
        raise TypeError(f"no flag for a {annotation} field: mark only str, int or float fields")
    return cast(type, annotation)


def flags_of(
    kinds: Sequence[str] | None = None, omit: Collection[str] = (), every_field: bool = False
) -> list[RerankerFlag]:
    """The flags of the given reranker kinds (all by default), in table and field order; a
    field several kinds mark is one flag. `every_field`: every option of a kind that a flag can
    carry, marked `Flag()` or not (`serve`, whose flags are the whole reranker spec)."""
    found: dict[str, RerankerFlag] = {}
    for kind in KINDS.values():
        if kinds is not None and kind.name not in kinds:
            continue
        marks = flag_fields(kind.config)
        if every_field:
            infos = kind.config.model_fields
            marks = {f: marks.get(f, Flag()) for f, i in infos.items() if flaggable(i)}
        for field, mark in marks.items():
            if field in omit:
                continue
            if field in found:
                seen = found[field]
                annotation = kind.config.model_fields[field].annotation
                if seen.config.model_fields[field].annotation != annotation:
                    raise TypeError(f"{field}: one flag for fields of different types")
                found[field] = RerankerFlag(field, (*seen.kinds, kind.name), seen.config, seen.path)
            else:
                found[field] = RerankerFlag(field, (kind.name,), kind.config, mark.path)
    return list(found.values())


def _help_kind(mark: KindFlags) -> inspect.Parameter:
    option = typer.Option(
        HELP_KIND,
        metavar="KIND",
        is_eager=True,
        expose_value=False,
        callback=show_kind,
        help=f"Show the options of one {mark.role} kind ({', '.join(mark.every_kind)}) and exit.",
    )
    return inspect.Parameter(
        "help_kind",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[str | None, option],
    )


def reranker_flags(
    *,
    role: str = "reranker",
    kinds: Sequence[str] | None = None,
    omit: Collection[str] = (),
    every_field: bool = False,
) -> Callable[[Command], Command]:
    """Give a command taking `**options` one flag per `Flag()` field of the `kinds` (all kinds
    by default) except `omit` (with `every_field`, per field a flag can carry); `role` names the
    option that picks the kind (`--teacher cis`)."""
    flags = flags_of(kinds, omit, every_field)

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        params = list(signature.parameters.values())
        if not params or params[-1].kind is not inspect.Parameter.VAR_KEYWORD:
            raise TypeError(f"{command.__name__} takes no **options for its reranker flags")
        clash = {f.field for f in flags} & set(signature.parameters)
        if clash:
            raise TypeError(f"{command.__name__} already has {', '.join(sorted(clash))}")
        generated = [flag.parameter(role) for flag in flags]
        # Whose each flag is, for the help: with several kinds, each kind's flags are on a
        # page of their own (`--help-kind KIND`) and the main help has a line per kind.
        kinds = {flag.field: flag.kinds for flag in flags}
        summaries = {k: KINDS[k].summary for f in flags for k in f.kinds}
        mark = KindFlags(f"--{role}", kinds, summaries)
        if mark.collapsed:
            generated.insert(0, _help_kind(mark))
        cast(Any, command).__signature__ = signature.replace(parameters=[*params[:-1], *generated])
        setattr(command, KIND_FLAGS, mark)
        return command

    return decorate
