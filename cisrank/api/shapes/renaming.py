"""A shape's body as the engine's query, and the fields a service error blames as the shape
names them.

The engine names fields by its queries' attributes (`cisrank.serving.types`): TEI calls the
documents `texts`, OpenAI calls its texts `input` (a single text is `input` itself), and Cohere
and cisrank's own shapes take a document as a string or an object, so that a document's text is
`documents.3` or `documents.3.text` as the client sent it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel

from cisrank.serving.errors import InvalidField
from cisrank.serving.types import Query

Rename = Callable[[str], str]

Q = TypeVar("Q", bound=Query)


def query_of(query: type[Q], body: BaseModel, **renamed: Any) -> Q:
    """The engine's `query` from a shape's `body`: the fields the shape names or shapes its own
    way given as `renamed`, every other field of the query taken from the body's field of its
    name (its default where the shape has none). Its limits were checked on the body: the same
    types (`cisrank.serving.types.TopN`...) declare them on both."""
    shared = {
        name: getattr(body, name)
        for name in query.model_fields
        if name not in renamed and name in type(body).model_fields
    }
    return query(**shared, **renamed)


@contextmanager
def fields_renamed(rename: Rename) -> Iterator[None]:
    """An `InvalidField` raised inside, with its field renamed by `rename`."""
    try:
        yield
    except InvalidField as exc:
        field = rename(exc.field)
        if field == exc.field:
            raise
        raise InvalidField(field, exc.detail) from None


def renamed_list(name: str, wire: str, single: bool = False) -> Rename:
    """The engine's list `name` (and its items `name.N`) as the shape's `wire`; with `single`,
    the shape sent one item, not a list, and the item is `wire` itself."""

    def rename(field: str) -> str:
        if field == name:
            return wire
        head, dot, rest = field.partition(".")
        if head != name or not dot:
            return field
        index, _, below = rest.partition(".")
        if single and index == "0":
            return f"{wire}.{below}" if below else wire
        return f"{wire}.{rest}"

    return rename


def item_texts(lists: Mapping[str, Sequence[object]], objects: bool) -> Rename:
    """For lists whose items the client sent as a string or an object: the text of item N of
    `lists[name]` is `name.N.text` for an object, `name.N` for a string. `objects`: the engine
    names it `name.N.text` (its items are objects), else `name.N` (strings)."""

    def rename(field: str) -> str:
        head = field.removesuffix(".text") if objects else field
        if objects and head == field:
            return field
        name, _, index = head.rpartition(".")
        items = lists.get(name)
        if items is None or not index.isdigit() or int(index) >= len(items):
            return field
        plain = isinstance(items[int(index)], str)
        if objects:
            return head if plain else field
        return field if plain else f"{field}.text"

    return rename
