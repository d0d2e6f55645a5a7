"""What `cisrank index build dense` costs on each bi-encoder runtime: a 100,000-passage index.

Why: a dense index of a corpus is embedded offline once, and on a 2-core CPU its time is the
runtime's speed. The corpus is every distinct real passage of ../shared/data (the DL19, DL21 and
DL22 BM25 candidates and the MS MARCO training triples' passages: 16,775, each its own text,
so no passage's embedding is a copy of another's), the first `--passages` of them. Each runtime
builds the same corpus with the CLI a user runs (`--backend`, `--dtype`), one after the other, in
one command; the index's own manifest gives the passages and the seconds are the command's wall
time (model load and FAISS included). The 100,000-passage figure is the measured rate times
100,000: encoding is linear in passages (one text a batch for int8; batches of a fixed size for
float32), and a flat FAISS index adds in milliseconds.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/dense_index_build.py \\
        --runtimes "onnx int8,torch float32" --passages 20000 --model all-MiniLM-L6-v2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import add_tag_option, machine_info, report, result_name

from cisrank.data.datasets import load_folder

SETS = ("trec-dl19", "trec-dl21", "trec-dl22")


def corpus(data: Path, limit: int) -> list[dict[str, str]]:
    """Distinct passages by text, in a fixed order: the sets' candidates, then the triples'."""
    seen: dict[str, str] = {}
    for name in SETS:
        ds = load_folder(data / name, require_qrels=False)
        for qid in ds.qids:
            for hit in ds.candidates[qid]:
                seen.setdefault(hit.text, f"{name}:{hit.docid}")
    triples = data / "msmarco-train" / "triples.train.small.first1000.tsv"
    for n, line in enumerate(triples.read_text(encoding="utf-8").splitlines()):
        for k, text in enumerate(line.split("\t")[1:]):
            seen.setdefault(text, f"train:{n}:{k}")
    rows = [{"id": pid, "text": text} for text, pid in seen.items()]
    return rows[:limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtimes", default="onnx int8,torch float32")
    ap.add_argument("--passages", type=int, default=20_000)
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--work", type=Path, default=Path("out/dense-index-build"))
    add_tag_option(ap)
    args = ap.parse_args()
    data = Path(os.environ.get("CISRANK_DATA_DIR", "../shared/data"))
    rows = corpus(data, args.passages)
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.work / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cisrank = [sys.executable, "-m", "cisrank.cli"]
    figures: dict[str, object] = {"machine": machine_info(), "model": args.model}
    figures["passages"] = len(rows)
    for runtime in [r.strip() for r in args.runtimes.split(",")]:
        backend, dtype = runtime.split()
        out = args.work / runtime.replace(" ", "-")
        shutil.rmtree(out, ignore_errors=True)
        cmd = [*cisrank, "index", "build", "dense", "--corpus", str(path), "--out", str(out)]
        cmd += ["--model", args.model, "--backend", backend, "--dtype", dtype, "-q"]
        started = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - started
        manifest = json.loads((out / "manifest.json").read_text())
        built = manifest["corpus"]["passages"]
        figures[runtime] = {
            "seconds": round(seconds, 1),
            "passages_per_s": round(built / seconds, 1),
            "100k_passages_min": round(100_000 / (built / seconds) / 60, 1),
            "recorded_runtime": [manifest["model"].get("runtime"), manifest["model"].get("dtype")],
        }
    report(result_name(f"dense_index_build-{args.model}", args.tag), figures)


if __name__ == "__main__":
    main()
