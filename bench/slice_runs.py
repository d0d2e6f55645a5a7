"""Cut saved runs down to each query's first-stage top N: the candidates a depth-N rerank sees.

A run of `cisrank eval --depth 100` scores the whole BM25 top 100; fusing it at depth 20 with a
run that holds only the top 20 (`bench/lm_backends.py --runs`) needs both over the same 20
passages, the BM25 top 20, not each run's own best 20.

    python bench/slice_runs.py trec-dl19 out/hyb20 --depth 20 cis=out/eval-dl19-cis/run.trec
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cisrank.data.datasets import load_folder
from cisrank.data.runs import Run
from cisrank.env import data_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", help="a folder name under $CISRANK_DATA_DIR, e.g. trec-dl19")
    ap.add_argument("out", type=Path, help="writes DATASET-NAME.trec here")
    ap.add_argument("runs", nargs="+", help="NAME=run.trec")
    ap.add_argument("--depth", type=int, default=20)
    args = ap.parse_args()
    ds = load_folder(data_dir() / args.dataset)
    top = {q: {h.docid for h in ds.candidates[q][: args.depth]} for q in ds.qids}
    for spec in args.runs:
        name, _, path = spec.partition("=")
        scores = Run.read_trec(Path(path), name=name).as_dict()
        kept = {
            q: [(d, s) for d, s in scores[q].items() if d in top[q]] for q in scores if q in top
        }
        missing = [q for q, pairs in kept.items() if len(pairs) != len(top[q])]
        if missing:
            raise SystemExit(f"{path}: lacks some of the top {args.depth} of queries {missing[:5]}")
        Run.from_scores(name, kept).write_trec(args.out / f"{args.dataset}-{name}.trec")
        print(f"{name}: {len(kept)} queries")


if __name__ == "__main__":
    main()
