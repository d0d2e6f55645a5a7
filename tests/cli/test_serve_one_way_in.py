"""Following `--reranker` from `cisrank serve` to the built reranker: the kind is looked up in
the registry once (when its spec is made), and the server's loader builds it in one call of
`RerankerSpec.build` (docs/architecture.md, "One way in").

Traced, not read: every call of `registry.kind_of` in any thread, and the `cisrank` functions on
the stack when the spec's kind is looked up (the command's side) and when the reranker class is
constructed (the loader thread of a worker's app, which gets the config pickled, as uvicorn's
workers do under `--workers N`)."""

from __future__ import annotations

import pickle
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import cisrank
from cisrank.api.app import create_app
from cisrank.cli.serve import server_config
from cisrank.rerank import registry
from cisrank.rerank.dense import DenseReranker

PACKAGE = str(Path(cisrank.__file__).parent)


def _stack(frame: FrameType | None) -> list[str]:
    """The `cisrank` functions on the stack from `frame` up, outermost first."""
    out = []
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(PACKAGE):
            out.append(code.co_qualname)
        frame = frame.f_back
    return out[::-1]


def test_serve_looks_the_kind_up_once_and_builds_it_in_one_call(tiny_bert_dir):
    lookups: list[list[str]] = []
    built: list[list[str]] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        if frame.f_code is registry.kind_of.__code__:
            lookups.append(_stack(frame.f_back))
        elif frame.f_code is DenseReranker.__init__.__code__:
            built.append(_stack(frame))

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        cfg = server_config(None, "dense", str(tiny_bert_dir))
        cfg = pickle.loads(pickle.dumps(cfg))  # what a worker process gets
        app = create_app(cfg, preflight=False, api_keys=[])  # a worker's app (`served_app`)
        serving = app.state.serving
        serving.start_loading()
        assert serving.wait_ready(120), serving.error
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert lookups == [["server_config", "RerankerSpec._checked", "RerankerSpec._resolved"]]
    assert built == [["Serving._load", "RerankerSpec.build", "DenseReranker.__init__"]]
