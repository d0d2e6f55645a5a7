"""Workers only where they pay: `cisrank rerank` of three passages with the default worker count
against `--workers 1`, and a large evaluation that still starts a worker per core.

Each setup runs as the user runs it, `cisrank ...` in a fresh process, timed from start to exit,
with the peak resident memory of its whole process tree and the most processes it ran at once
(sampled every 50 ms). The small job's setups alternate, `--repeats` times each, so that load
from other processes hits both alike. The bar: the default within 1.3x of `--workers 1` (it
starts no worker: one process). The large job (`eval` of DL19 at `--depth`, the dense reranker
by default: about a minute of one core's work) must still run on every core (processes =
cores), and with `--large-baseline` it is timed against `--workers 1` too.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/workers_pay.py \
        [--reranker cis --model smollm2-135m-instruct --repeats 2] [--large-baseline]

About 1 min of CPU for the small job with SmolLM2 (four runs, mostly model loads) and 1-2 min for
the large one on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import add_tag_option, dl19_dir, report, result_name

from cisrank.jobs.pool import cores

# The README's three documents.
PASSAGES = [
    "Paris is the capital of France.",
    "Hamlet is a tragedy set in Denmark.",
    "William Shakespeare wrote Hamlet.",
]
QUERY = "who wrote hamlet"


def cisrank_command() -> list[str]:
    exe = Path(sys.executable).with_name("cisrank")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cisrank"]


def run(argv: list[str]) -> dict[str, float]:
    """Wall seconds, peak RSS (MiB) of the process tree and the most processes at once."""
    import psutil

    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peak_rss = 0
    peak_procs = 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            rss = 0
            alive = 0
            for p in tree:
                try:
                    rss += p.memory_info().rss
                    alive += 1
                except psutil.Error:
                    pass
            # the multiprocessing resource tracker is a helper, not a worker
            workers = sum(1 for p in tree if "resource_tracker" not in " ".join(_cmd(p)))
            peak_rss, peak_procs = max(peak_rss, rss), max(peak_procs, workers)
        except psutil.Error:
            pass
        time.sleep(0.05)
    wall = time.perf_counter() - started
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {err.strip()[-800:]}")
    return {"seconds": wall, "peak_rss_mib": peak_rss / 2**20, "processes": peak_procs}


def _cmd(p) -> list[str]:
    import psutil

    try:
        return p.cmdline()
    except psutil.Error:
        return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reranker", default="cis")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--large-reranker", default="dense")
    ap.add_argument("--large-model", default="all-MiniLM-L6-v2")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--large-baseline", action="store_true", help="Also time --workers 1.")
    add_tag_option(ap)
    args = ap.parse_args(argv)

    cli = cisrank_command()
    with tempfile.TemporaryDirectory() as tmp:
        passages = Path(tmp) / "three.txt"
        passages.write_text("\n".join(PASSAGES) + "\n", encoding="utf-8")
        small = [*cli, "rerank", "--reranker", args.reranker, "--model", args.model]
        small += ["--query", QUERY, "--passages", str(passages)]
        setups = {"default": small, "--workers 1": [*small, "--workers", "1"]}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in setups}
        for i in range(args.repeats):
            order = list(setups) if i % 2 == 0 else list(setups)[::-1]
            for name in order:
                runs[name].append(run(setups[name]))
                print(f"  {name}: {runs[name][-1]}", flush=True)

        large = [*cli, "eval", "trec-dl19", "--data-dir", str(dl19_dir())]
        large += ["--reranker", args.large_reranker, "--model", args.large_model, "--quiet"]
        large += ["--depth", str(args.depth), "--output", str(Path(tmp) / "eval")]
        big = {"default": run(large)}
        if args.large_baseline:
            big["--workers 1"] = run([*large, "--workers", "1"])

    median = {n: statistics.median(r["seconds"] for r in rs) for n, rs in runs.items()}
    ratio = median["default"] / median["--workers 1"]
    result = {
        "cores": cores(),
        "small": {
            "command": " ".join(small[len(cli) :]),
            "runs": runs,
            "median_seconds": median,
            "default_over_workers_1": ratio,
            "bar": "default within 1.3x of --workers 1, one process",
            "passes": ratio <= 1.3 and all(r["processes"] == 1 for r in runs["default"]),
        },
        "large": {
            "command": " ".join(large[len(cli) :]).replace(tmp, "TMP"),
            "runs": big,
            "uses_every_core": big["default"]["processes"] >= cores(),
        },
    }
    if "--workers 1" in big:
        result["large"]["default_speedup"] = (
            big["--workers 1"]["seconds"] / big["default"]["seconds"]
        )
    report(result_name("workers_pay", args.reranker, args.tag), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
