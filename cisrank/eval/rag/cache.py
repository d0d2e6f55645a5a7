"""What `cisrank eval rag` computed once and never computes again: rankings and generations,
stored by what they are of, so that a rerun, an added reranker, an added k or another run over
the same questions (K = 10 from the K = 20 candidates, the answers after the retrieval figures)
reuses every score and answer it can.

- Scores: one folder per reranker spec (the hash of its kind, model and options), one file per
  scored chunk of questions, written atomically: a run killed midway keeps every chunk it
  finished. An entry is keyed by the query and its candidate texts in order (a reranker may fuse
  over the whole list); for a pointwise reranker (`pointwise`: each passage's score depends on
  the query and that passage alone) each (query, passage) score also serves any other list that
  holds the pair, which is how the K = 10 related set, the top of the K = 20 one, is scored once.
- Parts: for a kind whose settings differ in how they combine the same model sums (CIS:
  estimator, prior, normalization; the registry's `estimate_fields`), one folder per model
  setting and one file per side and chunk, each pair's sum and token count: every CIS setting
  of a grid that shares a model pass reads it from here.
- Generations: one folder per generator setting (model, template, chat, length, dtype), one file
  per prompt, keyed by the question, the prompt's passages best first and the arrangement: the
  exact prompt is a function of these. Two rerankers that choose the same top k, and a reranker
  whose top 1 is the gold (the gold-only baseline), share one generation.

Each stored item carries the seconds it took to compute, so the cost figures survive a resume.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from cisrank.errors import DataError
from cisrank.fileio import atomic_write_text


def digest(value: Any) -> str:
    """A short stable hash of a JSON-able value (keys sorted)."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _pair(query: str, text: str) -> str:
    return digest([query, text])


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(
            f"{path}: a damaged cache file ({exc}): delete it and rerun with --resume"
        ) from None


@dataclass(frozen=True)
class Scored:
    """One query's scores from the cache and the seconds they took (0 where they were put
    together from pairs scored for another list)."""

    scores: list[float]
    seconds: float


class ScoreCache:
    """The stored scores of one reranker (`spec`: its kind, model and options) under `root`."""

    def __init__(self, root: Path, spec: Mapping[str, Any], pointwise: bool) -> None:
        self.folder = Path(root) / "scores" / digest(dict(spec))
        self.pointwise = pointwise
        self._lists: dict[str, Scored] = {}
        self._pairs: dict[str, float] = {}
        if self.folder.is_dir():
            for path in sorted(self.folder.glob("*.json")):
                self._add(_read(path)["entries"])

    def _add(self, entries: Iterable[Mapping[str, Any]]) -> None:
        for e in entries:
            self._lists[e["key"]] = Scored(list(e["scores"]), float(e["seconds"]))
            if self.pointwise:
                self._pairs.update(zip(e["pairs"], e["scores"], strict=True))

    def get(self, query: str, texts: Sequence[str]) -> Scored | None:
        """The stored scores of `texts` for `query`, or None."""
        hit = self._lists.get(digest([query, list(texts)]))
        if hit is not None or not self.pointwise:
            return hit
        pairs = [self._pairs.get(_pair(query, t)) for t in texts]
        if any(p is None for p in pairs):
            return None
        return Scored([float(p) for p in pairs if p is not None], 0.0)

    def put(
        self,
        requests: Sequence[tuple[str, Sequence[str]]],
        scores: Sequence[Sequence[float]],
        seconds: float,
    ) -> None:
        """Store one chunk's scores (`seconds`: the chunk's model time, shared evenly by its
        queries) as one file, atomically."""
        each = seconds / max(len(requests), 1)
        entries = [
            {
                "key": digest([query, list(texts)]),
                "pairs": [_pair(query, t) for t in texts],
                "scores": [float(s) for s in values],
                "seconds": each,
            }
            for (query, texts), values in zip(requests, scores, strict=True)
        ]
        self.folder.mkdir(parents=True, exist_ok=True)
        name = digest([e["key"] for e in entries])
        atomic_write_text(self.folder / f"{name}.json", json.dumps({"entries": entries}))
        self._add(entries)


class PartsCache:
    """The stored model sums of one CIS model setting (`key`: kind, model and the options that
    are not `estimate_fields`) under `root`: per side (`conditional`, `prior`,
    `query_likelihood`), each pair's sum and token count, and each question's seconds, so that
    every estimate, prior and normalization of that setting reads one pass of the model.
    Stored as `ScoreCache` stores scores: one file per side and chunk, written atomically."""

    COUNT: ClassVar[dict[str, str]] = {
        "conditional": "doc_tokens",
        "prior": "doc_tokens",
        "query_likelihood": "query_tokens",
    }

    def __init__(self, root: Path, key: Mapping[str, Any]) -> None:
        self.folder = Path(root) / "parts" / digest(dict(key))
        self._pairs: dict[str, dict[str, tuple[float, float]]] = {}
        self._seconds: dict[str, dict[str, float]] = {}
        if self.folder.is_dir():
            for path in sorted(self.folder.glob("*.json")):
                data = _read(path)
                self._add(data["side"], data["entries"])

    def _add(self, side: str, entries: Iterable[Mapping[str, Any]]) -> None:
        pairs = self._pairs.setdefault(side, {})
        seconds = self._seconds.setdefault(side, {})
        for e in entries:
            seconds[e["key"]] = float(e["seconds"])
            pairs.update(zip(e["pairs"], zip(e["values"], e["tokens"], strict=True), strict=True))

    def has(self, side: str, query: str, texts: Sequence[str]) -> bool:
        pairs = self._pairs.get(side, {})
        return all(_pair(query, t) in pairs for t in texts)

    def parts(
        self, sides: Sequence[str], query: str, texts: Sequence[str]
    ) -> list[dict[str, float]]:
        """Each pair's stored parts of `sides`, with the token counts `estimate` divides by."""
        out = []
        for t in texts:
            key = _pair(query, t)
            row: dict[str, float] = {}
            for side in sides:
                value, tokens = self._pairs[side][key]
                row[side] = float(value)
                row[self.COUNT[side]] = float(tokens)
            out.append(row)
        return out

    def seconds(self, sides: Sequence[str], query: str, texts: Sequence[str]) -> float:
        """The model seconds these sides took for this list (0 for a side whose pairs were
        scored for another list: K = 10 read from K = 20)."""
        key = digest([query, list(texts)])
        return sum(self._seconds.get(side, {}).get(key, 0.0) for side in sides)

    def put(
        self,
        side: str,
        requests: Sequence[tuple[str, Sequence[str]]],
        parts: Sequence[Sequence[Mapping[str, float]]],
        seconds: float,
    ) -> None:
        """Store one chunk's `side` (`seconds`: its model time, shared evenly by its questions)
        as one file, atomically."""
        each = seconds / max(len(requests), 1)
        count = self.COUNT[side]
        entries = [
            {
                "key": digest([query, list(texts)]),
                "pairs": [_pair(query, t) for t in texts],
                "values": [float(p[side]) for p in rows],
                "tokens": [int(p[count]) for p in rows],
                "seconds": each,
            }
            for (query, texts), rows in zip(requests, parts, strict=True)
        ]
        self.folder.mkdir(parents=True, exist_ok=True)
        name = digest([side, [e["key"] for e in entries]])
        atomic_write_text(
            self.folder / f"{side}-{name}.json", json.dumps({"side": side, "entries": entries})
        )
        self._add(side, entries)


class GenerationCache:
    """The stored answers of one generator setting (`setting`) under `root`."""

    def __init__(self, root: Path, setting: Mapping[str, Any]) -> None:
        self.folder = Path(root) / "generations" / digest(dict(setting))

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        return _read(path) if path.is_file() else None

    def put(self, key: str, answer: Mapping[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(dict(answer), ensure_ascii=False))


def prompt_key(question: str, passages: Sequence[Any], arrange: str) -> str:
    """The key of one generation: the question, its passages best first (title and text) and
    their arrangement, which with the generator setting make the exact prompt."""
    return digest([question, [[p.title, p.text] for p in passages], arrange])
