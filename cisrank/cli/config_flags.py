"""A flag group generated from a config class's fields: one `--flag` per field, so that the flag's
name, type, help and default are read from the field instead of being written again per verb.

Each flag defaults to None ("keep the config's default") and the group's value is the dict of
what was given, keyed by parameter name, ready for `Config().replace(...)` or an index kind's
`params`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel

from cisrank.cli.defaults import config_flag
from cisrank.cli.options import FlagGroup
from cisrank.cli.reranker_flags import cli_type
from cisrank.config import flag_name


def config_flags(
    config: type[BaseModel],
    fields: Sequence[str],
    *,
    renamed: Mapping[str, str] | None = None,
    aliases: Mapping[str, Sequence[str]] | None = None,
    texts: Mapping[str, str] | None = None,
) -> FlagGroup[dict[str, Any]]:
    """The flags of `fields`, in that order. A field's parameter (and flag) is named after it
    unless `renamed` says otherwise; `aliases` adds flag names (`-m`); `texts` replaces a help
    text (the default is still the field's). A bool field is an on/off pair (`--x/--no-x`); a
    Literal one reads text, which the config checks with its one-line error."""
    renamed, aliases, texts = renamed or {}, aliases or {}, texts or {}
    annotations: dict[str, Any] = {}
    for field in fields:
        name = renamed.get(field, field)
        info = config.model_fields[field]
        kind = bool if info.annotation is bool else cli_type(info)
        flag = flag_name(name)
        if kind is bool:
            flag += f"/--no-{flag[2:]}"
        option = config_flag(config, field, flag, *aliases.get(field, ()), text=texts.get(field))
        annotations[name] = Annotated[kind | None, option]
    flags = type("Flags", (), {"__annotations__": annotations, **dict.fromkeys(annotations)})
    return FlagGroup(flags, dict)
