"""Help text for flags that fill a config: the description and default come from the config
class, so a default is written once (in the class) and the help cannot drift from it."""

from __future__ import annotations

from typing import Any

import typer
from pydantic import BaseModel


def field_help(config: type[BaseModel], field: str, text: str | None = None) -> str:
    """`text` (else the field's description) and the field's default, for a flag whose value
    None means "the config's default"."""
    info = config.model_fields[field]
    help_text = text if text is not None else (info.description or "")
    if info.is_required():  # nothing to show
        return help_text
    # a default made by a factory (an empty mapping, ...) is shown as what the factory makes
    default = info.get_default(call_default_factory=True)
    if default is None or (isinstance(default, dict | list | tuple | set) and not default):
        return help_text
    if isinstance(default, str) and not default:
        default = "empty"
    elif isinstance(default, bool):  # a flag: on or off, not Python's True or False
        default = "on" if default else "off"
    return f"{help_text} (default {default})".strip()


def config_flag(
    config: type[BaseModel], field: str, *names: str, text: str | None = None, **option: Any
) -> Any:
    """A typer option (`names`, `option` such as `min=0`) for one config field, its help read
    from the field (`field_help`): `Annotated[int | None, config_flag(C, "depth", "--depth")]`."""
    return typer.Option(*names, help=field_help(config, field, text), **option)
