"""Dense encoders follow the project's precision policy (`cisrank.devices.resolve_dtype`), and
dense index manifests record the precision their embeddings were computed in."""

import numpy as np
import pytest
import torch

import cisrank.devices
from cisrank.data.manifest import read_manifest
from cisrank.indexes.build import build_index
from cisrank.indexes.kinds import open_index
from cisrank.models import encoders

ROWS = [
    ("p1", "the quick brown fox jumps over the lazy dog"),
    ("p2", "a fox is a small wild animal"),
    ("p3", "dogs are loyal animals and good friends"),
]


@pytest.fixture
def corpus(write_corpus):
    return write_corpus(ROWS)


class _FakeEncoder:
    """Stands in for SentenceTransformer on a machine without a GPU: records the casts."""

    def __init__(self, path, device=None):
        self.device = device
        self.dtype = torch.float32
        self.max_seq_length = 256

    def half(self):
        self.dtype = torch.float16
        return self

    def to(self, *args, dtype=None, **kwargs):
        self.dtype = dtype or next((a for a in args if isinstance(a, torch.dtype)), self.dtype)
        return self


@pytest.mark.parametrize(
    ("bf16_supported", "requested", "expected"),
    [
        (True, None, torch.bfloat16),  # the policy: bf16 where the GPU supports it
        (False, None, torch.float16),  # fp16 only on GPUs without bf16
        (True, "float32", torch.float32),  # an explicit dtype wins
    ],
)
def test_cuda_encoder_precision_follows_resolve_dtype(
    monkeypatch, tiny_bert_dir, bf16_supported, requested, expected
):
    import sentence_transformers

    monkeypatch.setattr(encoders, "resolve_device", lambda device=None: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_supported)
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", _FakeEncoder)
    policy = cisrank.devices.resolve_dtype(requested, torch.device("cuda"))
    assert policy == expected
    kwargs = {} if requested is None else {"dtype": requested}
    encoder = encoders.load_sentence_transformer(str(tiny_bert_dir), **kwargs)
    assert encoder.device == "cuda" and encoder.dtype == policy


def test_dense_manifest_records_the_policy_dtype(monkeypatch, tmp_path, corpus, tiny_bert_dir):
    params = {"model": str(tiny_bert_dir)}
    cpu = build_index("dense", corpus, tmp_path / "cpu", params, progress=False)
    assert cpu.params["dtype"] is None  # asked for: the device's default
    assert cpu.model["dtype"] == "float32"  # used: the CPU policy
    assert read_manifest(tmp_path / "cpu").model["dtype"] == "float32"

    # A device whose policy is bf16 (as a bf16-capable GPU's is): the build encodes in bf16.
    monkeypatch.setattr(cisrank.devices, "default_dtype", lambda device: torch.bfloat16)
    bf16 = build_index("dense", corpus, tmp_path / "bf16", params, progress=False)
    assert bf16.model["dtype"] == "bfloat16"
    a = np.load(tmp_path / "cpu" / "embeddings.npy")
    b = np.load(tmp_path / "bf16" / "embeddings.npy")
    assert not np.array_equal(a, b)  # really computed in another precision...
    np.testing.assert_allclose(a, b, atol=0.05)  # ...of the same model


def test_explicit_dense_dtype_is_a_parameter_and_used_to_search(tmp_path, corpus, tiny_bert_dir):
    params = {"model": str(tiny_bert_dir), "dtype": "bfloat16"}
    m = build_index("dense", corpus, tmp_path / "i", params, progress=False)
    assert m.params["dtype"] == "bfloat16" and m.model["dtype"] == "bfloat16"
    r = open_index(tmp_path / "i")
    # queries embedded as the passages were: torch bf16 (autocast on a CPU)
    assert (r.runtime, r.dtype, r.encoder.compute_type) == ("torch", "bfloat16", "bfloat16")
    assert r.search("small wild animal", 1)[0].docid in {d for d, _ in ROWS}
