"""The prompt that asks a causal LM for the query a passage answers, and what is kept of its reply.

InPars (Bonifacio et al., SIGIR 2022) showed that a language model shown a few real (document,
query) pairs writes, for a new document, a query that document answers, and that those queries
train rerankers; Promptagator (Dai et al., ICLR 2023) drew the shots per document and kept only
the queries whose source document the retriever finds again (round-trip consistency, the filter
of `cisrank.distill.synth`). The prompt here is InPars' "vanilla" one,

    Example 1:
    Document: <a real passage>
    Relevant Query: <the real query it answers>
    ...
    Example k+1:
    Document: <the passage>
    Relevant Query:

as plain text after the model's BOS, not a chat turn: on the MS MARCO training shots both
SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct answered a chat-formatted request with
sentences about the passage, and this one with queries (bench/archive/RESULTS-to-2026-12-02.md, "A
student that beats similarity": what was measured of `distill synth` before its data was lost). The
shots are drawn per (passage, query number) from a seed, so a passage's second query reads other
examples than its first (greedy decoding then differs by its prompt, not by chance), and a rerun, on
any number of workers, draws the same shots.

No torch here: the driver renders every prompt before a model is loaded.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cisrank.data.datasets import guarded_json, open_text
from cisrank.errors import DataError

TEMPLATE_EXAMPLE = "Example {n}:\nDocument: {passage}\nRelevant Query: {query}\n\n"
TEMPLATE_ASK = "Example {n}:\nDocument: {passage}\nRelevant Query:"


@dataclass(frozen=True)
class SynthItem:
    """One query to write: its passage and prompt (rendered in the driver)."""

    docid: str
    n: int
    prompt: str


@dataclass(frozen=True)
class Shot:
    """A real (query, passage) example shown to the model."""

    query: str
    passage: str


def read_shots(path: str | Path) -> list[Shot]:
    """The examples of a shots file: MS MARCO triples (`query<TAB>positive<TAB>negative`: the
    positive is the example), `query<TAB>passage` lines, or JSON lines with `query` and
    `passage`. Repeated queries are kept once (their first passage)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"shots file '{path}' does not exist")
    shots: dict[str, Shot] = {}
    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            shot = _shot(line, path, n)
            shots.setdefault(shot.query, shot)
    if not shots:
        raise DataError(f"shots file '{path}' holds no example")
    return list(shots.values())


def _shot(line: str, path: Path, n: int) -> Shot:
    if line.lstrip().startswith("{"):
        row = guarded_json(line, f"{path}:{n}")
        if not isinstance(row, dict):
            raise DataError(f"{path}:{n}: expected an object with 'query' and 'passage'")
        query, passage = row.get("query"), row.get("passage")
    else:
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) not in (2, 3):
            raise DataError(
                f"{path}:{n}: expected query<TAB>passage, query<TAB>positive<TAB>negative or a "
                f"JSON object, got {len(parts)} field(s)"
            )
        query, passage = parts[0], parts[1]
    for name, value in (("query", query), ("passage", passage)):
        if not isinstance(value, str) or not value.strip():
            raise DataError(f"{path}:{n}: '{name}' must be non-empty text")
    assert isinstance(query, str) and isinstance(passage, str)
    return Shot(_squash(query), _squash(passage))


def _squash(text: str) -> str:
    return " ".join(text.split())


def clip(text: str, chars: int) -> str:
    """`text` cut to at most `chars` characters at a word boundary (whole when it fits): shots
    and passages are cut so a prompt stays a few hundred tokens on any passage."""
    text = _squash(text)
    if len(text) <= chars:
        return text
    cut = text[:chars]
    space = cut.rfind(" ")
    return cut[:space] if space > 0 else cut


def draw_shots(shots: Sequence[Shot], k: int, seed: int, docid: str, n: int) -> list[Shot]:
    """`k` distinct shots for query `n` of passage `docid`: a function of those and the seed
    alone (not of the order passages are read in, nor of which worker reads them)."""
    if k > len(shots):
        raise DataError(f"--num-shots {k} is more than the {len(shots)} examples of the shots file")
    digest = hashlib.sha256(f"{seed}\x1f{docid}\x1f{n}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big")).sample(list(shots), k)


def render(shots: Sequence[Shot], passage: str, *, shot_chars: int, passage_chars: int) -> str:
    """The prompt asking for the query `passage` answers, after `shots`."""
    parts = [
        TEMPLATE_EXAMPLE.format(n=i, passage=clip(s.passage, shot_chars), query=s.query)
        for i, s in enumerate(shots, 1)
    ]
    parts.append(TEMPLATE_ASK.format(n=len(shots) + 1, passage=clip(passage, passage_chars)))
    return "".join(parts)


_LETTER = re.compile(r"[^\W\d_]", re.UNICODE)


def clean(text: str) -> str:
    """The query in a reply: its first line, whitespace squashed, surrounding quotes dropped."""
    line = text.strip().split("\n", 1)[0]
    line = _squash(line).strip()
    if len(line) >= 2 and line[0] == line[-1] and line[0] in "\"'`":
        line = line[1:-1].strip()
    return line


def rejection(query: str, shots: Sequence[Shot], max_words: int) -> str | None:
    """Why a cleaned reply is no query (None: it is one): `empty` (no letter), `long` (more than
    `max_words` words: the model went on writing the passage), `shot` (a shot's own query, which
    small models echo)."""
    if not _LETTER.search(query):
        return "empty"
    if len(query.split()) > max_words:
        return "long"
    folded = query.casefold()
    if any(folded == s.query.casefold() for s in shots):
        return "shot"
    return None


def query_key(query: str) -> str:
    """What two generated queries share when they are the same query (case and spacing aside)."""
    return _squash(query).casefold()
