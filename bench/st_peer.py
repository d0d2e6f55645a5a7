"""sentence-transformers' own encode paths, as a peer process of `bench/dense_runtimes.py`.

Why a process of its own: sentence-transformers' `backend="onnx"` needs `optimum-onnx`, whose
newest release pins transformers < 4.58 while cisrank runs transformers 5, so the peer runs in a
virtual environment of its own (`--st-python`; how to make one is in dense_runtimes.py's
docstring). This script imports sentence-transformers only, never cisrank.

The paths, each with sentence-transformers' defaults (batch size 32, embeddings normalized as
the score is a cosine):
- `st torch`: `SentenceTransformer(model).encode`, torch float32;
- `st onnx`: `backend="onnx"`, the export sentence-transformers makes and saves itself;
- `st onnx int8`: its `export_dynamic_quantized_onnx_model` (the `avx512_vnni` configuration on
  a CPU with VNNI, else `avx2`) loaded by file name.

Protocol: one JSON line a request on stdin, `{"name", "query", "passages"}`; one JSON line back,
`{"seconds", "scores"}`, timed here around the query's and the passages' encoding and the dot
products (what cisrank's `DenseReranker.score` does), so the pipe's cost is not counted. The
first line back is `{"loads": {name: seconds}}` once every path is loaded (exports included).

    python st_peer.py MODEL_FOLDER WORK_FOLDER THREADS "st torch,st onnx,st onnx int8"
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path


def vnni() -> bool:
    try:
        return "avx512_vnni" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def load(name: str, source: Path, work: Path, threads: int):
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer

    if name == "st torch":
        return SentenceTransformer(str(source), device="cpu")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads  # as many threads as cisrank's session has
    onnx_dir = work / "onnx"
    if not (onnx_dir / "model.onnx").exists():  # export once into the work copy, then reuse
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(source, work)
        SentenceTransformer(str(work), device="cpu", backend="onnx").save_pretrained(str(work))
    if name == "st onnx":
        kwargs = {"session_options": options}
        return SentenceTransformer(str(work), device="cpu", backend="onnx", model_kwargs=kwargs)
    from sentence_transformers import export_dynamic_quantized_onnx_model

    config = "avx512_vnni" if vnni() else "avx2"
    file = f"model_qint8_{config}.onnx"
    if not (onnx_dir / file).exists():
        fp32 = SentenceTransformer(str(work), device="cpu", backend="onnx")
        export_dynamic_quantized_onnx_model(fp32, config, str(work))
    kwargs = {"file_name": f"onnx/{file}", "session_options": options}
    return SentenceTransformer(str(work), device="cpu", backend="onnx", model_kwargs=kwargs)


def main() -> None:
    source, work, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[4]
    threads = int(sys.argv[3])
    import torch

    torch.set_num_threads(threads)
    models, loads = {}, {}
    for name in names.split(","):
        t = time.perf_counter()
        models[name] = load(name, source, work, threads)
        loads[name] = time.perf_counter() - t
    print(json.dumps({"loads": loads}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        model = models[ask["name"]]
        t = time.perf_counter()
        q = model.encode([ask["query"]], normalize_embeddings=True)
        p = model.encode(ask["passages"], normalize_embeddings=True)
        scores = (p @ q[0]).tolist()
        print(json.dumps({"seconds": time.perf_counter() - t, "scores": scores}), flush=True)


if __name__ == "__main__":
    main()
