"""Which reranker's passages answer the question: the RAG evaluation of `cisrank eval rag`.

The CIS paper's claim (Tables 1, 2 and 4 of "Grounding Large Language Model with Causal
Knowledge Retrieval") is about answers, not nDCG: choosing the top-k passages by CIS instead of
similarity raises the generator's accuracy, EM and F1, and dropping log p(K) costs about 40% of
them. This package measures that on any question file with gold passages:

    from pathlib import Path
    from cisrank.eval.rag import RagEvalConfig, read_specs, run_rag_eval

    config = RagEvalConfig(questions=Path("nq-open-oracle.first2000.jsonl.gz"), limit=300,
                           candidates=20, distractors="related", top_k=(1, 3, 5),
                           generator="smollm2-135m-instruct")
    result = run_rag_eval(config, read_specs("bench/rag_rerankers.json"), Path("out/rag"))
    result.metrics["rerankers"]["cis"]["3"]   # {gold_recall, accuracy, em, f1, answered}

Modules: `questions` (the file, the candidate sets), `answers` (accuracy, EM, F1), `cache`
(rankings and answers stored by what they are of), `jobs` (the model work, on a worker per
core), `run` (the pipeline), `report` (figures, paired tests, outputs).
"""

from __future__ import annotations

from cisrank.eval.rag.answers import Verdict, exact_match, f1, has_answer, judge, normalize_answer
from cisrank.eval.rag.questions import (
    CandidateSet,
    Pool,
    Question,
    build_candidates,
    candidate_sets,
    load_questions,
)
from cisrank.eval.rag.report import figures_table, read_per_question, summarize, tests_table
from cisrank.eval.rag.run import FIRST_STAGE, RagEvalConfig, RagResult, run_rag_eval
from cisrank.rerank.spec import RerankerSpec, read_specs

__all__ = [
    "FIRST_STAGE",
    "CandidateSet",
    "Pool",
    "Question",
    "RagEvalConfig",
    "RagResult",
    "RerankerSpec",
    "Verdict",
    "build_candidates",
    "candidate_sets",
    "exact_match",
    "f1",
    "figures_table",
    "has_answer",
    "judge",
    "load_questions",
    "normalize_answer",
    "read_per_question",
    "read_specs",
    "run_rag_eval",
    "summarize",
    "tests_table",
]
