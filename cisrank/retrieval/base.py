"""The first-stage interface: every retriever (bm25s, Lucene, dense FAISS, fusion) looks the same,
and every index kind declares its parameters the same way (`IndexConfig`).

The reranker needs passage text, so a search hit carries it (from the index's document store).
A retriever also declares that store (`docs`, None where it has none of its own): callers that
draw passages from an index (the API's noise passages) read it, never probe for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

from cisrank.config import ComponentConfig
from cisrank.data.types import SearchHit
from cisrank.errors import CisrankError


class DocumentStore(Protocol):
    """An index's passages by row number (`cisrank.retrieval.docstore.DocStore`)."""

    def __len__(self) -> int: ...

    def get(self, indices: Sequence[int]) -> list[tuple[str, str]]:
        """(docid, text) of each row, in the order given."""
        ...


@runtime_checkable
class Retriever(Protocol):
    """Top-k search over one corpus; hits best first with strictly comparable scores."""

    name: str

    @property
    def docs(self) -> DocumentStore | None:
        """The index's document store, or None where the retriever has none of its own."""
        ...

    def search(self, query: str, k: int = 10) -> list[SearchHit]: ...

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[SearchHit]]: ...


class IndexConfig(ComponentConfig):
    """Parameters that define what an index holds. The manifest records them (`model_dump()`),
    a build with other parameters starts clean, and an opened index is searched with the ones it
    was built with. How a build runs (device, batch sizes of the prior job) is passed as options
    instead, so that changing it never throws finished work away."""

    label: ClassVar[str] = "index"
    """The index kind's name (as `cisrank.indexes.kinds` registers it), for error messages."""
    unknown_hint: ClassVar[str] = ""
    """Appended to the unknown-parameter error (e.g. which names are options instead)."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None = None) -> Self:
        """Validated parameters from a build call, the CLI or a manifest: None keeps the default,
        so a manifest written before a parameter existed opens with that parameter's default."""
        params = dict(params or {})
        unknown = sorted(set(params) - set(cls.model_fields))
        if unknown:
            raise CisrankError(
                f"unknown {cls.label} parameters {unknown}: known {sorted(cls.model_fields)}"
                + cls.unknown_hint
            )
        # Unvalidated defaults merged with `params` and validated together by `replace`: a kind
        # whose defaults are not valid alone (the prior's model) still gets a one-line error.
        return cls.model_construct().replace(**params)
