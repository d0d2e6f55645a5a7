"""Every test of a pull keeps its integrity stamps in a cache of its own, never the user's; the
fake packages and catalogue (`pull_fakes`) are importable by name, here and in subprocesses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cisrank.models import integrity


@pytest.fixture(autouse=True)
def own_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    cache = tmp_path / "user-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(integrity, "_MEMORY", {})
    monkeypatch.setattr(integrity, "_WARNED", set())
    return cache


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The model home every pull of a test writes to, its own."""
    home = tmp_path / "home"
    monkeypatch.setenv("CISRANK_MODEL_HOME", str(home))
    return home
