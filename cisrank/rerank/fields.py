"""Structured documents ranked by their fields (Cohere's `rank_fields`).

RAG clients hold records (JSON rows, YAML front matter, search hits with a title and a body), not
plain passages. With `rank_fields`, a document is ranked by the text of those fields, in the order
given, one `field: value` line each, as Cohere v1 renders them; the fields not named are not
read. A document may be a mapping, or a string holding a JSON object or a YAML mapping (Cohere
v2's advice for structured data). A string is read as a record only where it parses to a mapping
holding at least one of the fields named, so prose that happens to parse as YAML ("Note: ...")
stays prose; prose is the record `{"text": the string}`. A field a record lacks is an error
naming the document and the field (`MissingField`): a field silently rendered empty would rank
the document by less than was asked.

Values are rendered as they read: a string as it is, anything else as compact JSON (a date that
YAML parsed, as its text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cisrank.errors import CisrankError

Document = str | Mapping[str, Any]


class MissingField(CisrankError):
    """Document `index` has no field `field` of the `rank_fields` asked."""

    def __init__(self, index: int, field: str) -> None:
        super().__init__(
            f"documents[{index}] has no field '{field}': give every document each of the "
            "rank_fields, or rank without them"
        )
        self.index = index
        self.field = field


def _parsed(text: str) -> Any:
    """`text` as JSON, else as YAML without aliases (where PyYAML is installed), else None.

    Aliases are refused: a few hundred bytes of nested aliases parse to references that render
    as exponentially many values (a "billion laughs" document), and a record of user text needs
    none. Nesting too deep for the parser (RecursionError) is prose too, never a server error."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            return json.loads(stripped)
        except (ValueError, RecursionError):
            pass
    try:
        import yaml
    except ImportError:
        return None

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise yaml.YAMLError("aliases are not read in a record")
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=NoAliases)  # a SafeLoader that reads no alias
    except (yaml.YAMLError, RecursionError):
        return None


def as_record(document: Document, fields: Sequence[str]) -> Mapping[str, Any]:
    """The record a document is ranked from (module docstring)."""
    if isinstance(document, Mapping):
        return document
    parsed = _parsed(document) if any(f in document for f in fields) else None
    if isinstance(parsed, Mapping) and any(f in parsed for f in fields):
        return parsed
    return {"text": document}


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def render(document: Document, fields: Sequence[str], index: int) -> str:
    """Document `index` as the `field: value` lines of `fields`, in their order."""
    record = as_record(document, fields)
    lines = []
    for field in fields:
        if field not in record:
            raise MissingField(index, field)
        lines.append(f"{field}: {_value(record[field])}")
    return "\n".join(lines)


def render_all(documents: Sequence[Document], fields: Sequence[str]) -> list[str]:
    """Every document rendered by `fields`; the first that lacks one is `MissingField`."""
    if not fields:
        raise CisrankError("rank_fields: name at least one field")
    return [render(d, fields, i) for i, d in enumerate(documents)]
