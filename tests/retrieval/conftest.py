"""Fixtures shared by the first-stage tests."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest


@pytest.fixture
def write_corpus(tmp_path) -> Callable[[Sequence[tuple[str, str]]], Path]:
    """Writes (docid, text) rows as the `index build` corpus (JSON lines) and returns its path."""

    def write(rows: Sequence[tuple[str, str]]) -> Path:
        path = tmp_path / "corpus.jsonl"
        path.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in rows))
        return path

    return write
