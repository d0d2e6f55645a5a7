"""Fixtures of the distillation tests."""

from __future__ import annotations

import pytest

from cisrank.distill.generate import generate
from cisrank.distill.sources import load_source
from cisrank.distill.teachers import load_teacher


@pytest.fixture
def rows_dir(data_sets, tmp_path):
    """Teacher rows whose scores a tiny student can learn: a score per passage plus an offset per
    query (which per-query standardization removes), written as a teacher run file."""
    source = load_source(dataset="trec-dl22", data_dir=data_sets / "trec-dl22", depth=5)
    run = tmp_path / "teacher.trec"
    run.write_text(
        "".join(
            f"{q.qid} Q0 {d} {r} {3.0 * int(d[1:]) + 10 * n} t\n"
            for n, q in enumerate(source.queries)
            for r, d in enumerate(q.docids, 1)
        )
    )
    generate(source, load_teacher("scores", scores_file=run), tmp_path / "rows", progress=False)
    return tmp_path / "rows"
