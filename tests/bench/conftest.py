"""The benchmark tests' one way to import a bench/ script: they are scripts, not a package."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench_script() -> Iterator[Callable[[str], ModuleType]]:
    """`bench_script("rag_nq")` is bench/rag_nq.py as the module `bench_rag_nq`. Until the test
    module ends, bench/ is on sys.path (the scripts import `common`) and the module is in
    sys.modules (dataclasses look their module up there)."""
    loaded: list[str] = []
    sys.path.insert(0, str(BENCH))

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None, name
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        loaded.append(spec.name)
        spec.loader.exec_module(module)
        return module

    yield load
    for name in loaded:
        sys.modules.pop(name, None)
    sys.path.remove(str(BENCH))
