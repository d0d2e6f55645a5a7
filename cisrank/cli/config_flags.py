"""A flag group generated from a config class's fields: one `--flag` per field, so that the flag's
name, type, help and default are read from the field instead of being written again per verb. The
fields are named, or are those the class marks `Flag()` (in field order), as the reranker flags.

Each flag defaults to None ("keep the config's default") and the group's value is the dict of
what was given, keyed by parameter name, ready for `Config().replace(...)` or an index kind's
`params`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel

from cisrank.cli.defaults import config_flag
from cisrank.cli.options import FlagGroup
from cisrank.cli.reranker_flags import cli_type
from cisrank.config import flag_fields, flag_name


def config_flags(
    config: type[BaseModel],
    fields: Sequence[str] | None = None,
    *,
    omit: Collection[str] = (),
    renamed: Mapping[str, str] | None = None,
    aliases: Mapping[str, Sequence[str]] | None = None,
    texts: Mapping[str, str] | None = None,
    ranged: Collection[str] = (),
) -> FlagGroup[dict[str, Any]]:
    """The flags of `fields`, in that order (by default the fields `config` marks `Flag()`, in
    field order), but for `omit`. A field's parameter (and flag) is named after it unless
    `renamed` says otherwise; `aliases` adds flag names (`-m`); `texts` replaces a help text (the
    default is still the field's). A bool field is an on/off pair (`--x/--no-x`); a Literal one
    reads text, which the config checks with its one-line error, as it does the bounds of a
    number, but for the `ranged` fields: their `Field(ge=, le=)` are typer's min and max (its
    usage error and `[x>=2]` in the help)."""
    renamed, aliases, texts = renamed or {}, aliases or {}, texts or {}
    chosen = list(flag_fields(config) if fields is None else fields)
    annotations: dict[str, Any] = {}
    for field in (f for f in chosen if f not in omit):
        name = renamed.get(field, field)
        info = config.model_fields[field]
        kind = bool if info.annotation is bool else cli_type(info)
        flag = flag_name(name)
        if kind is bool:
            flag += f"/--no-{flag[2:]}"
        bounds = {
            typer_name: getattr(m, bound)
            for typer_name, bound in (("min", "ge"), ("max", "le"))
            for m in info.metadata
            if field in ranged and getattr(m, bound, None) is not None
        }
        option = config_flag(
            config, field, flag, *aliases.get(field, ()), text=texts.get(field), **bounds
        )
        annotations[name] = Annotated[kind | None, option]
    flags = type("Flags", (), {"__annotations__": annotations, **dict.fromkeys(annotations)})
    return FlagGroup(flags, dict)
