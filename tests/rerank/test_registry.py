"""One `RerankerKind` record per kind: every reranker class has the one constructor shape, the
registry alone knows the kinds, and the hybrid builds its parts without importing the registry."""

import ast
import inspect
from pathlib import Path

import pytest

import cisrank.rerank
from cisrank.config import ComponentConfig
from cisrank.errors import CisrankError, UnknownRerankerError
from cisrank.rerank.hybrid import HybridReranker
from cisrank.rerank.registry import KINDS, available, config_fields, kind_of

RERANK = Path(cisrank.rerank.__file__).parent


def test_every_kind_has_a_config_and_a_class_of_the_one_shape():
    assert available() == ["none", "cis", "cross-encoder", "dense", "hybrid", "student"]
    for name, kind in KINDS.items():
        assert kind.name == name and kind.summary
        assert issubclass(kind.config, ComponentConfig)
        assert config_fields(name) == set(kind.config.model_fields)
        cls = kind.load_class()
        assert cls.name == name
        params = list(inspect.signature(cls).parameters.values())
        assert params[0].name == "model" and params[0].default is None
        assert params[1].name == "config" and params[1].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[-1].kind is inspect.Parameter.VAR_KEYWORD
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:-1])
    with pytest.raises(UnknownRerankerError, match="choose one of none, cis"):
        kind_of("bm99")


def _imports(path: Path) -> set[str]:
    """Every `cisrank` module a file imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cisrank"):
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def test_what_the_registry_imports_never_imports_it_back():
    """No import circle through the registry, imports inside functions included (the hybrid
    gets the registry handed in as its `parts`)."""
    theirs = {m for m in _imports(RERANK / "registry.py") if m.startswith("cisrank.rerank.")}
    modules = [RERANK / f"{m.removeprefix('cisrank.rerank.')}.py" for m in theirs]
    modules = [p for p in modules if p.exists()]
    assert {p.stem for p in modules} >= {"base", "configs", "cis", "dense", "hybrid"}
    for path in modules:
        assert not {"cisrank.rerank.registry", "cisrank.rerank"} & _imports(path), path.name


def test_a_hybrid_without_parts_builds_nothing():
    with pytest.raises(CisrankError, match="no reranker for cis"):
        HybridReranker(fuse="cis:1,first-stage:1")
    with pytest.raises(CisrankError, match="options given"):
        HybridReranker(fuse="first-stage:1", estimator="reverse")
    r = HybridReranker(fuse="first-stage:1")
    assert [p.index for p in r.rank("q", ["a", "b", "c"])] == [0, 1, 2]


def test_load_reranker_refuses_a_kind_that_is_not_a_string_in_one_line(tiny_bert_dir):
    """`load_reranker(["dense"])` was a TypeError (unhashable list) from a dict lookup; now a
    CisrankError naming the kinds. A path object is a model folder."""
    from cisrank.rerank.registry import load_reranker

    for kind in (["dense"], None, 3):
        with pytest.raises(UnknownRerankerError, match=r"the kind is one name, a string \(none, "):
            load_reranker(kind)  # type: ignore[arg-type]
    with pytest.raises(CisrankError, match="model is a name or a folder"):
        load_reranker("dense", model=["all-MiniLM-L6-v2"])  # type: ignore[arg-type]
    r = load_reranker("dense", model=Path(tiny_bert_dir))  # type: ignore[arg-type]
    assert r.model_name == str(tiny_bert_dir)
