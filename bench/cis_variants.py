"""CIS variants with a real LM on TREC DL, from one pass: estimators, templates, sum vs mean, with
and without the prior, and what passage length does to each.

Every variant is a function of three per-pair quantities the engine computes anyway: log p(K|Q)
under a forward template, log p(K) (the prior, from the prior store), and log p(Q|K) under a
passage-first template, plus token counts. So one pass per template gives the whole ablation
table, and each row is exactly what `cisrank eval` prints for that configuration (scores do not
depend on the batch: tests/rerank/test_cis*.py), built with eval's own `rerank_run` (top `depth`
reranked, the rest kept below in BM25 order). Variants:

- forward sum / mean: log p(K|Q) - log p(K), summed or per passage token (`--normalize`);
- w/o prior (the CIS paper's "w/o p(K)" ablation): log p(K|Q) alone, sum / mean;
- prior alone: log p(K), to see how much of a ranking the prior carries by itself;
- reverse: log p(Q|K) (mean equals sum up to a per-query constant, so one row);
- both: (forward + reverse) / 2, as `--estimator both` computes it.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/cis_variants.py --dataset trec-dl21 \
        --depth 20 --templates qa,chat,plain --reverse-templates upr,chat \
        --prior-store out/priors-smollm2.sqlite
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from common import write_result
from scipy import stats

from cisrank.data.datasets import load_named
from cisrank.eval import metrics as M
from cisrank.eval.pipeline import first_stage_run, rerank_run
from cisrank.rerank.base import BaseReranker
from cisrank.rerank.cis import CISReranker

MEASURES = ("nDCG@10", "RR(rel=2)@10", "R(rel=2)@100", "nDCG@5")


class Table(BaseReranker):
    """Scores looked up by (query, passage): replays a variant through eval's own rerank_run."""

    def __init__(self, name: str, scores: dict[tuple[str, str], float]) -> None:
        self.name = name
        self.model_name = name
        self.scores = scores

    def score_batch(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        return [[self.scores[(q, p)] for p in ps] for q, ps in requests]


def mean_spearman(pairs: dict[str, list[tuple[float, float]]]) -> float:
    """Mean over queries of Spearman's rho between two per-passage quantities."""
    rhos = []
    for values in pairs.values():
        a, b = zip(*values, strict=True)
        if len(set(a)) > 1 and len(set(b)) > 1:
            rhos.append(stats.spearmanr(a, b).statistic)
    return float(np.mean(rhos)) if rhos else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="trec-dl21")
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--templates", default="qa,chat,plain", help="forward templates")
    ap.add_argument("--reverse-templates", default="upr,chat")
    ap.add_argument("--prior-store", default="out/priors-smollm2.sqlite")
    ap.add_argument("--max-doc-tokens", type=int, default=512)
    ap.add_argument("--pairs-out", type=Path, default=None, help="per-pair TSV (default out/)")
    ap.add_argument(
        "--name", default=None, help="result name (default cis_variants_{dataset}_d{depth})"
    )
    args = ap.parse_args()

    ds = load_named(args.dataset)
    requests = [(ds.topics[q], [h.text for h in ds.candidates[q][: args.depth]]) for q in ds.qids]
    forward_templates = [t for t in args.templates.split(",") if t]
    reverse_templates = [t for t in args.reverse_templates.split(",") if t]
    base = CISReranker(
        model=args.model, prior_store=args.prior_store, max_doc_tokens=args.max_doc_tokens
    )
    engine = base.engine
    lengths = {
        (q, p): len(d) for q, ps in requests for p, d in zip(ps, base.passage_ids(ps), strict=True)
    }
    columns: dict[str, dict[tuple[str, str], float]] = {}
    seconds: dict[str, float] = {}

    def record(name: str, values: list[list[float]]) -> None:
        columns[name] = {
            (q, p): v
            for (q, ps), vs in zip(requests, values, strict=True)
            for p, v in zip(ps, vs, strict=True)
        }

    for template in forward_templates:
        r = CISReranker(
            template=template,
            prior_store=base.prior_store,
            max_doc_tokens=args.max_doc_tokens,
            engine=engine,
        )
        t = time.perf_counter()
        triples = r.components_batch(requests)
        seconds[f"forward {template}"] = time.perf_counter() - t
        record(f"cond[{template}]", [list(c) for _, c, _ in triples])
        record("prior", [list(p) for _, _, p in triples])
        print(f"forward {template}: {seconds[f'forward {template}']:.0f} s", flush=True)
    for template in reverse_templates:
        r = CISReranker(
            estimator="reverse",
            reverse_template=template,
            max_doc_tokens=args.max_doc_tokens,
            engine=engine,
        )
        t = time.perf_counter()
        record(f"reverse[{template}]", r.reverse_batch(requests))
        seconds[f"reverse {template}"] = time.perf_counter() - t
        print(f"reverse {template}: {seconds[f'reverse {template}']:.0f} s", flush=True)

    keys = list(lengths)
    n = {k: lengths[k] for k in keys}
    variants: dict[str, dict[tuple[str, str], float]] = {}
    commands: dict[str, str] = {}
    cmd = f"cisrank eval {args.dataset} --reranker cis --model {args.model} --depth {args.depth}"
    if args.max_doc_tokens != 512:
        cmd += f" --max-doc-tokens {args.max_doc_tokens}"
    if "prior" in columns:
        variants["prior alone, log p(K)"] = columns["prior"]
    for t in forward_templates:
        cond, prior = columns[f"cond[{t}]"], columns["prior"]
        fwd = {k: cond[k] - prior[k] for k in keys}
        variants[f"forward {t} sum"] = fwd
        variants[f"forward {t} mean"] = {k: fwd[k] / n[k] for k in keys}
        variants[f"w/o prior {t} sum"] = cond
        variants[f"w/o prior {t} mean"] = {k: cond[k] / n[k] for k in keys}
        fc = f"{cmd} --estimator forward --template {t} --prior-store {args.prior_store}"
        commands[f"forward {t} sum"] = fc
        commands[f"forward {t} mean"] = fc + " --normalize mean"
        for rt in reverse_templates:
            rev = columns[f"reverse[{rt}]"]
            variants[f"both {t}+{rt} sum"] = {k: (fwd[k] + rev[k]) / 2 for k in keys}
            commands[f"both {t}+{rt} sum"] = (
                f"{cmd} --estimator both --template {t} --reverse-template {rt} "
                f"--prior-store {args.prior_store}"
            )
    for rt in reverse_templates:
        variants[f"reverse {rt}"] = columns[f"reverse[{rt}]"]
        commands[f"reverse {rt}"] = f"{cmd} --estimator reverse --reverse-template {rt}"

    figures: dict[str, dict[str, Any]] = {
        "BM25": M.evaluate(first_stage_run(ds), ds.qrels, MEASURES)
    }
    qid_of = {ds.topics[q]: q for q in ds.qids}
    grade = {
        (q, p): ds.qrels.get(qid_of[q], {}).get(h.docid, 0)
        for q in qid_of
        for h, p in ((h, h.text) for h in ds.candidates[qid_of[q]][: args.depth])
    }
    for name, scores in variants.items():
        run, _ = rerank_run(ds, Table(name, scores), args.depth, progress=False)
        by_query: dict[str, list[tuple[float, float]]] = {}
        with_grade: dict[str, list[tuple[float, float]]] = {}
        for (q, p), v in scores.items():
            by_query.setdefault(q, []).append((v, n[(q, p)]))
            with_grade.setdefault(q, []).append((v, grade[(q, p)]))
        figures[name] = {
            **M.evaluate(run, ds.qrels, MEASURES),
            "spearman_with_length": mean_spearman(by_query),
            "spearman_with_grade": mean_spearman(with_grade),
            "command": commands.get(name),
        }
    print(f"\n{args.dataset}, BM25 top {args.depth} reranked, {len(requests)} queries")
    print(f"{'variant':28s} " + " ".join(f"{m:>12s}" for m in MEASURES) + "  rho(len) rho(grade)")
    for name, f in figures.items():
        extra = (
            f"  {f['spearman_with_length']:+.3f}   {f['spearman_with_grade']:+.3f}"
            if "spearman_with_length" in f
            else ""
        )
        print(f"{name:28s} " + " ".join(f"{f[m]:12.4f}" for m in MEASURES) + extra)
    out = args.pairs_out or Path("out") / f"cis-variants-{args.dataset}-d{args.depth}.tsv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        w = csv.writer(fh, delimiter="\t")
        w.writerow(["qid", "passage_tokens", "grade", *columns])
        for k in keys:
            w.writerow([qid_of[k[0]], n[k], grade[k], *(f"{columns[c][k]:.6f}" for c in columns)])
    write_result(
        args.name or f"cis_variants_{args.dataset.replace('-', '_')}_d{args.depth}",
        {
            "dataset": args.dataset,
            "depth": args.depth,
            "model": args.model,
            "queries": len(requests),
            "pairs": len(keys),
            "seconds": seconds,
            "figures": figures,
        },
    )


if __name__ == "__main__":
    main()
