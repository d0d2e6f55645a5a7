"""Long documents made from a judged TREC DL set: every candidate passage padded by unrelated
passages to 1,000-5,000 words, the original text at the start, the middle or the end.

Why: a reranker that reads a document up to its model's window (256 tokens for the student and
MiniLM) ranks a long document by its first 200 words. With the judged passage buried in filler,
the judgments stay valid (the relevant text is all there, once, unchanged) and nDCG@10 measures
how much of a document each way of reading it finds: truncation sees the passage only when it
comes first; max-pooling over windows sees it wherever it lies.

The filler comes from passages no evaluation judges (TREC DL22's pool by default: unjudged,
training-side, `../shared/GUIDE.md` data rules), never from the same query's candidates, so no
filler passage is relevant by accident to the query it pads. Everything is drawn from
`random.Random` seeded by (seed, qid, docid): the same seed gives the same folder on any host,
and a document's padding does not depend on which other documents are built.

    python bench/long_docs.py trec-dl21 out/long-dl21-end --position end
    cisrank eval trec-dl21 --data-dir out/long-dl21-end --reranker student ...
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

from cisrank.data.datasets import QRELS_FILE, TOPICS_FILE, load_folder
from cisrank.data.types import Dataset
from cisrank.env import data_dir

POSITIONS = ("start", "middle", "end")
MIN_WORDS, MAX_WORDS = 1000, 5000


def pad(text: str, filler: Sequence[str], position: str, rng: random.Random, words: int) -> str:
    """`text` with filler passages (drawn from `filler` by `rng`, each used at most once) before
    and/or after it until the document holds at least `words` words; `text` itself unchanged,
    at `position`. Passages are joined by a blank line, as a page's paragraphs."""
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {', '.join(POSITIONS)}, not {position!r}")
    need = max(0, words - len(text.split()))
    used: set[int] = set()
    drawn: list[str] = []
    while need > 0:
        if len(used) == len(filler):
            raise ValueError(f"the filler holds too few words to pad a document to {words}")
        i = rng.randrange(len(filler))
        if i not in used:
            used.add(i)
            drawn.append(filler[i])
            need -= len(filler[i].split())
    cut = {"start": 0, "middle": len(drawn) // 2, "end": len(drawn)}[position]
    return "\n\n".join([*drawn[:cut], text, *drawn[cut:]])


def padded(
    ds: Dataset,
    filler: Dataset,
    position: str,
    seed: int = 0,
    words: tuple[int, int] = (MIN_WORDS, MAX_WORDS),
) -> dict[str, list[dict[str, object]]]:
    """Per query, its candidates with their text padded to a length drawn uniformly from
    `words`: the candidates file's rows."""
    pool = filler.passages()
    rows: dict[str, list[dict[str, object]]] = {}
    for qid in ds.qids:
        own = {h.docid for h in ds.candidates[qid]}
        texts = [t for d, t in pool.items() if d not in own]
        hits = []
        for h in ds.candidates[qid]:
            rng = random.Random(f"{seed}:{qid}:{h.docid}")
            hits.append(
                {
                    "content": pad(h.text, texts, position, rng, rng.randint(*words)),
                    "qid": qid,
                    "docid": h.docid,
                    "rank": h.rank,
                    "score": h.score,
                }
            )
        rows[qid] = hits
    return rows


def write(
    src: Path,
    dst: Path,
    filler: Path,
    position: str,
    seed: int = 0,
    words: tuple[int, int] = (MIN_WORDS, MAX_WORDS),
) -> Path:
    """A dataset folder at `dst` that `load_folder` reads: the padded candidates, the topics and
    qrels of `src` copied. Written to a temporary folder and renamed, so a folder that exists is
    complete."""
    ds = load_folder(src)
    rows = padded(ds, load_folder(filler, require_qrels=False), position, seed, words)
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    out = [{"query": ds.topics[q], "hits": hits} for q, hits in rows.items()]
    with gzip.open(tmp / "candidates-bm25-top100.json.gz", "wt", encoding="utf-8") as f:
        json.dump(out, f)
    for name in (TOPICS_FILE, QRELS_FILE):
        shutil.copyfile(src / name, tmp / name)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", help="a judged folder under $CISRANK_DATA_DIR, e.g. trec-dl21")
    ap.add_argument("out", type=Path, help="the padded dataset folder to write")
    ap.add_argument("--position", choices=POSITIONS, default="end")
    ap.add_argument("--filler", default="trec-dl22", help="an unjudged folder's pool")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    root = data_dir()
    if root is None:
        ap.error("set CISRANK_DATA_DIR to the folder that holds the TREC DL sets")
    out = write(root / args.dataset, args.out, root / args.filler, args.position, args.seed)
    print(out)


if __name__ == "__main__":
    main()
