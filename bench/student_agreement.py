"""How closely a student orders each query's candidates as its teacher does, from two run files.

The second figure beside nDCG@10: the mean per-query Spearman correlation between the
student's scores and the teacher's over the pairs both scored (the same function `distill run`
and the trainer's reports use, `cisrank.distill.evaluate.spearman_to_teacher`). The teacher's run
is what `cisrank eval` (one component) or `cisrank eval fuse` (the hybrid, fused exactly as the
labels were) wrote over the same candidates; nDCG@10 of both comes with it, and their paired
randomization test.

    python bench/student_agreement.py --student out/eval-dl19-student/run.trec \
        --teacher out/eval-dl19-teacher/run.trec [--dataset trec-dl19]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cisrank.data.datasets import load_folder
from cisrank.data.runs import Run
from cisrank.distill.evaluate import spearman_to_teacher
from cisrank.env import data_dir
from cisrank.eval import metrics as M


def agreement(student: Run, teacher: Run, qrels: dict[str, dict[str, int]]) -> dict[str, object]:
    s, t = student.as_dict(), teacher.as_dict()
    out: dict[str, object] = dict(spearman_to_teacher(s, t))
    per_s = M.per_query(student, qrels, ("nDCG@10",))
    per_t = M.per_query(teacher, qrels, ("nDCG@10",))
    out["student_nDCG@10"] = M.mean(per_s)["nDCG@10"]
    out["teacher_nDCG@10"] = M.mean(per_t)["nDCG@10"]
    out["student_vs_teacher"] = M.paired_test(per_t["nDCG@10"], per_s["nDCG@10"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", required=True, type=Path)
    ap.add_argument("--teacher", required=True, type=Path)
    ap.add_argument("--dataset", default="trec-dl19")
    args = ap.parse_args()
    root = data_dir()
    if root is None:
        raise SystemExit("set CISRANK_DATA_DIR to the folder that holds the TREC DL datasets")
    dataset = load_folder(root / args.dataset)
    got = agreement(Run.read_trec(args.student), Run.read_trec(args.teacher), dataset.qrels)
    print(json.dumps(got, indent=2, default=str))


if __name__ == "__main__":
    main()
