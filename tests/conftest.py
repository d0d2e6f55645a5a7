"""Shared fixtures: tiny models saved to temp dirs, small query sets, and the real TREC DL data in
../shared/data."""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The brute-force references of the LM tests are float32 torch: `--backend auto` (ONNX int8 on a
# CPU) is pinned to the exact runtime here; tests of `auto` set their own environment.
os.environ["CISRANK_LM_BACKEND"] = "torch"
# Likewise the bf16 defaults of a CPU with native bf16 (CIS, the cross-encoder): the suite runs
# float32 on every host, AVX2 or AVX-512 BF16 alike (spawned workers inherit this); tests of the
# bf16 defaults set CISRANK_CPU_BF16=1 themselves.
os.environ["CISRANK_CPU_BF16"] = "0"
# The cross-encoder's `auto` (its default: ONNX int8 on a CPU with onnxruntime) likewise runs
# torch here, whose float32 scores the tests compare exactly; tests of `auto` set their own.
os.environ["CISRANK_ENCODER_BACKEND"] = "torch"
# A catalogue model named but not pulled is never downloaded by a test (the pull on first use
# is tested against a folder of fake wheels, with this set to 1 by the test itself).
os.environ["CISRANK_AUTO_PULL"] = "0"

from builders import write_set
from encode_memo import EncodeMemo

from cisrank import testing

REPO_ROOT = Path(__file__).resolve().parents[1]


def _data_root() -> Path:
    env = os.environ.get("CISRANK_DATA_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def _thread_baseline() -> tuple[int, dict[str, str | None]]:
    """Torch's threads and the BLAS variables as the session started, before any test or
    fixture changed them."""
    import torch

    from cisrank.jobs.pool import THREAD_ENV

    return torch.get_num_threads(), {name: os.environ.get(name) for name in THREAD_ENV}


def _restore_threads(baseline: tuple[int, dict[str, str | None]]) -> None:
    import torch

    threads, env = baseline
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _threads_restored(_thread_baseline):
    """Each test runs with the session's thread settings. A worker pool, and `cisrank index
    build` or `cisrank distill` invoked in-process (by a test or a fixture), set torch's threads
    to one per worker and the BLAS variables that subprocesses inherit: every later test ran on
    one core, and the DL19 MiniLM figures took 104 s instead of 63."""
    _restore_threads(_thread_baseline)
    yield
    _restore_threads(_thread_baseline)


@pytest.fixture(scope="session")
def data_root() -> Path:
    """Root of the real datasets; tests that need it skip (with the reason) where it is absent."""
    root = _data_root()
    if not (root / "trec-dl19").is_dir():
        pytest.skip(
            f"real TREC DL data not found at {root}: set CISRANK_DATA_DIR to the folder that holds "
            "trec-dl19/ (../shared/data in this workplace)"
        )
    return root


@pytest.fixture(scope="session")
def dl19_dir(data_root: Path) -> Path:
    return data_root / "trec-dl19"


@pytest.fixture(scope="session")
def encode_memo() -> EncodeMemo:
    """Bi-encoder rows shared by the slow tests that embed the same DL19 passages
    (tests/encode_memo.py says why and what it keeps exact)."""
    return EncodeMemo()


@pytest.fixture(scope="session")
def word_vocab() -> list[str]:
    return testing.words(testing.SAMPLE_SENTENCES)


@pytest.fixture(scope="session")
def word_tokenizer(word_vocab):
    return testing.word_level_tokenizer(word_vocab)


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory, word_tokenizer) -> Path:
    return testing.build_causal_lm(tmp_path_factory.mktemp("gpt2"), word_tokenizer, "gpt2")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, word_tokenizer) -> Path:
    return testing.build_causal_lm(tmp_path_factory.mktemp("llama"), word_tokenizer, "llama")


@pytest.fixture(scope="session")
def tiny_gpt2_bpe_dir(tmp_path_factory) -> Path:
    tok = testing.bpe_tokenizer(testing.SAMPLE_SENTENCES * 3, vocab_size=320)
    return testing.build_causal_lm(tmp_path_factory.mktemp("gpt2bpe"), tok, "gpt2")


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, word_vocab) -> Path:
    return testing.build_bert(tmp_path_factory.mktemp("bert"), word_vocab)


@pytest.fixture(scope="session")
def ce_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    """A one-logit cross-encoder on the tiny BERT, saved as training saves one."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    model = CrossEncoder(str(tiny_bert_dir), num_labels=1, device="cpu")
    with torch.no_grad():
        # The default head (std 0.02) gives scores within ~1e-4 of each other: widen them so that
        # a 1e-5 agreement is a real check and not just "all scores are about equal".
        model.model.classifier.weight.normal_(0.0, 1.0)
    out = tmp_path_factory.mktemp("cross-encoder")
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for the `--engine ray` tests, started once per session (the
    jobs find it initialized and use it) and shut down at the end. Skips, saying why, only where
    Ray is not installed (`make test` installs the `ray` extra)."""
    try:
        import ray
        import ray.data
    except ImportError:
        pytest.skip("Ray is not installed: pip install 'cisrank[ray]' to run the Ray engine tests")
    ray.init(
        num_cpus=2,
        object_store_memory=256 * 1024**2,  # the tests ship kilobytes; keep /dev/shm free
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    yield ray
    ray.shutdown()


@pytest.fixture
def data_sets(tmp_path: Path) -> Path:
    """trec-dl22 (unjudged, training), trec-dl21 (judged, dev), trec-dl19 (judged, test)."""
    root = tmp_path / "data"
    write_set(root, "trec-dl22", ["101", "102", "103", "104"], judged=False)
    write_set(root, "trec-dl21", ["105", "106"])
    write_set(root, "trec-dl19", ["101", "104", "106"])
    return root


SHARED_WORK = {"ray_cluster": "ray", "encode_memo": "dl19-minilm"}
"""Session fixtures whose work the tests that use them share: one Ray cluster of 2 CPUs; the
DL19 pool's MiniLM embeddings (tests/encode_memo.py, about 100 s)."""


@functools.cache
def _shared_work_group(path: str) -> str | None:
    """The group of the test file `path` (relative to the root): the first of `SHARED_WORK`'s
    fixtures its text names, else None."""
    try:
        text = (REPO_ROOT / path).read_text(encoding="utf-8")
    except OSError:
        return None
    return next((group for name, group in SHARED_WORK.items() if name in text), None)


class _GroupsFirst(OrderedDict):
    """xdist's work queue with `SHARED_WORK`'s groups at its head, in their order: the longest
    work units start first instead of ending the run on one worker, and a worker runs the Ray
    tests before any other test can start a JVM in it (Lucene, pyserini): Ray's driver installs
    its own SIGSEGV handler, which a JVM started before it needs for itself."""

    def __setitem__(self, key: str, value: dict[str, bool]) -> None:
        super().__setitem__(key, value)
        if key in SHARED_WORK.values():
            for group in reversed([g for g in SHARED_WORK.values() if g in self]):
                self.move_to_end(group, last=False)


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs the suite on a worker per core (`pytest -n N --dist loadscope`,
    pytest-xdist). Tests go to workers one by one, as `--dist load` sends them (one run each on
    this 2-core host: 538 s for the suite, 982 s sending whole files), except that the files
    using one of `SHARED_WORK`'s fixtures go together, to one worker, first
    (`_GroupsFirst`), so the work is done once, not once per worker, and two Ray clusters never
    compete for the same cores. (xdist's own `xdist_group` marks are inert under pytest 9, which
    keeps a node's id where xdist 3.8 no longer renames it; a file's text decides here.)"""
    if config.getvalue("dist") != "loadscope":
        return None  # another --dist asked: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class SharedWorkScheduling(LoadScopeScheduling):
        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            self.workqueue = _GroupsFirst()

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _shared_work_group(path) or nodeid

    return SharedWorkScheduling(config, log)
