"""The runtime table is the one list of runtimes: the configs' `backend` values, the checks and
the loaders all read it, so a new runtime is one loader and one row."""

from __future__ import annotations

import typing

import pytest

from cisrank.errors import CisrankError
from cisrank.indexes.prior import PriorIndexConfig
from cisrank.lm.backends import load_engine
from cisrank.rerank.configs import (
    CPU_BATCH_SIZE,
    CISRerankerConfig,
    CrossEncoderRerankerConfig,
    DenseRerankerConfig,
)
from cisrank.runtimes import table
from cisrank.runtimes.table import (
    CAUSAL_LM,
    FEATURE_EXTRACTION,
    SEQUENCE_CLASSIFICATION,
    Runtime,
    TaskRuntime,
)
from cisrank.testing import SAMPLE_SENTENCES, exact_engine


def _literal(config: type, field: str) -> tuple[str, ...]:
    annotation = config.model_fields[field].annotation
    return typing.get_args(annotation)


@pytest.mark.parametrize(
    "config", [CISRerankerConfig, CrossEncoderRerankerConfig, DenseRerankerConfig, PriorIndexConfig]
)
def test_every_backend_field_takes_the_tables_names(config):
    assert _literal(config, "backend") == table.BACKENDS == ("auto", "torch", "ctranslate2", "onnx")


def test_tasks_compute_types_and_batches_come_from_the_rows():
    assert table.names(CAUSAL_LM) == ("torch", "ctranslate2", "onnx")
    assert table.names(SEQUENCE_CLASSIFICATION) == ("torch", "onnx")
    assert table.compute_types("ctranslate2", CAUSAL_LM) == ("float32", "int8_float32", "int8")
    assert table.compute_types("onnx", SEQUENCE_CLASSIFICATION) == ("float32", "int8")
    assert table.names(FEATURE_EXTRACTION) == ("torch", "onnx")
    assert table.compute_types("onnx", FEATURE_EXTRACTION) == ("float32", "int8")
    assert table.runtime("torch", FEATURE_EXTRACTION).cpu_batch_size == 16
    assert CPU_BATCH_SIZE == {"torch": 32, "onnx": 8, "int8": 1}
    with pytest.raises(ValueError) as err:
        CrossEncoderRerankerConfig(backend="ctranslate2")
    assert "ctranslate2 runs causal LMs only; a cross-encoder runs on torch or onnx" in str(
        err.value
    )


def test_a_new_runtime_is_one_loader_and_one_row(monkeypatch):
    """A row naming `cisrank.testing.load_exact_lm` makes `load_engine(backend=...)` score on it;
    nothing else is edited. Without the row the name is unknown, with the table's list."""
    with pytest.raises(CisrankError, match="unknown LM backend 'exact': one of auto, torch, "):
        load_engine("exact-lm", backend="exact")
    row = Runtime("exact", None, {CAUSAL_LM: TaskRuntime("cisrank.testing:load_exact_lm", None)})
    monkeypatch.setitem(table._BY_NAME, "exact", row)
    assert table.backends()[-1] == "exact" and table.names(CAUSAL_LM)[-1] == "exact"
    engine = load_engine("exact-lm", backend="exact")
    assert type(engine.backend).__name__ == "ExactLM"
    reference = exact_engine()
    passages = [reference.tokenizer.encode(t, add_special_tokens=False) for t in SAMPLE_SENTENCES]
    got = engine.score_continuations([1], passages).logprobs
    assert got == reference.score_continuations([1], passages).logprobs
    assert all(s == int(s) < 0 for s in got)  # ExactLM's integer sums, not a default path's
    # the runtime serves causal LMs only: a cross-encoder on it is the table's one line
    with pytest.raises(ValueError, match="exact runs causal LMs only; a cross-encoder runs on"):
        table.check_serves("exact", SEQUENCE_CLASSIFICATION)
