"""The settings of every reranker kind, one `ComponentConfig` each, apart from the model code.

Kept here rather than beside each reranker because the CLI builds its reranker flags from these
fields at start-up and the registry checks options against them before any model loads: neither
may import torch (`cisrank eval --reranker none` never does). The fields marked `Flag()` are the
reranker flags of `eval`, `rerank` and `distill`; the others come from a config file or code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from cisrank.config import ComponentConfig, Flag
from cisrank.fusion import RRF_K, Method, Normalization, parse_weights
from cisrank.lm.prompts import resolve_forward, resolve_reverse
from cisrank.runtimes.table import (
    DYNAMIC_INT8_CPU_BATCH_SIZE,
    FEATURE_EXTRACTION,
    SEQUENCE_CLASSIFICATION,
    BackendName,
    check_serves,
    compute_types,
    names,
    runtime,
)

Estimator = Literal["forward", "reverse", "both"]

DEFAULT_CIS_MODEL = "smollm2-135m-instruct"
"""The causal LM of CIS when none is named: the catalogue's SmolLM2-135M-Instruct, the model
every CIS figure of bench/RESULTS.md was measured with."""

STUDENT_MODEL = "cisrank-student"
"""The student shipped with cisrank (`cisrank.models.shipped`), the `student` kind's model."""

DEFAULT_HYBRID_FUSE = "cis:0.3,dense:0.7"
"""The hybrid's fusion when none is named: `bench/hybrid_select.py --cv 5` on DL21 (5-fold
cross-validation over families of fusions, the family with the best held-out nDCG@10 refitted on
all of DL21): linear min-max, CIS 0.3 and the dense bi-encoder 0.7 (bench/RESULTS.md, 'A stronger
bi-encoder: all-mpnet-base-v2', hybrid_select_d20_minilm.json)."""

CPU_BATCH_SIZE = {
    **{
        name: runtime(name, SEQUENCE_CLASSIFICATION).cpu_batch_size
        for name in names(SEQUENCE_CLASSIFICATION)
    },
    "int8": DYNAMIC_INT8_CPU_BATCH_SIZE,
}
"""Cross-encoder pairs per model batch on a CPU, by runtime, and in dynamic int8 on any runtime:
the runtime table's measured figures (`cisrank.runtimes.table`)."""
GPU_BATCH_SIZE = 128
"""Cross-encoder pairs per model batch when unset: small on CPU (less padding), large on GPU."""


DEFAULT_PASSAGE_CACHE_MB = 64
"""The dense reranker's passage-embedding cache when none is asked for (`cisrank.rerank.
passage_cache`): 64 MiB holds about 36,000 passages of a 384-dimension model (all-MiniLM-L6-v2:
1,536 bytes a vector plus 288 of overhead) or 20,000 of a 768-dimension one (all-mpnet-base-v2),
a RAG corpus's working set many requests deep, at a sixth of MiniLM's own weights (90 MB) and a
fraction of mpnet's (420 MB); each `--workers` process keeps its own."""


class NoRerankerConfig(ComponentConfig):
    """`none` keeps the first stage's order: it has no model and no option."""

    label: ClassVar[str] = "no reranker"


class DenseRerankerConfig(ComponentConfig):
    """A sentence-transformers bi-encoder scored by cosine of normalized embeddings."""

    label: ClassVar[str] = "dense reranker"

    model: str = "all-MiniLM-L6-v2"
    batch_size: int | None = Field(
        default=None,
        ge=1,
        description="Texts per encoder batch; 16 on CPU (less padding: 1.2x faster than 32 on "
        "DL19 passages, see bench/RESULTS.md), 1 in int8 (a dynamic int8 embedding then depends "
        "on its text alone), 128 on GPU when unset.",
    )
    device: str | None = Field(
        default=None, description="torch device (cpu, cuda, cuda:1); unset: CUDA when present."
    )
    max_seq_length: int | None = Field(
        default=None, ge=1, description="Token limit; the model's own (256 for MiniLM) when unset."
    )
    query_prefix: str = Field(
        default="", description="Text put before every query (e.g. 'query: ' for E5 encoders)."
    )
    passage_prefix: str = Field(
        default="", description="Text put before every passage (e.g. 'passage: ' for E5)."
    )
    passage_cache_mb: Annotated[int, Flag()] = Field(
        default=DEFAULT_PASSAGE_CACHE_MB,
        ge=0,
        description="MiB of passage embeddings kept in memory by content hash and model, "
        "runtime, dtype and length, least recently used evicted (0: off): a passage sent "
        f"again costs no encoding. Default {DEFAULT_PASSAGE_CACHE_MB}: about 36,000 MiniLM or "
        "20,000 mpnet passages. Off where an embedding moves with its batch company (bf16, "
        "float16, int8 over several texts a batch).",
    )
    # backend and dtype share their flags with the CIS reranker's (the help shows its text)
    backend: Annotated[BackendName, Flag()] = Field(
        default="torch",
        description="torch (default): sentence-transformers' encode, exact float32 (or bf16 "
        "under autocast), CPU or GPU; onnx: the model's modules exported once to ONNX and run "
        "by ONNX Runtime (CPU), float32 (as torch's to 1e-5) or int8; auto: the fastest whose "
        "DL21 nDCG@10 is within 0.003 of float32's: onnx int8 on a CPU with the onnx extra "
        "(0.31x float32's time, DL21 0.5801 vs 0.5775), torch float32 on a CPU without it "
        "(bf16 moved an embedding with its batch company), torch on a GPU (bench/RESULTS.md).",
    )
    dtype: Annotated[str | None, Flag()] = Field(
        default=None,
        description="torch: float32 (default on a CPU), bfloat16 (autocast; fast on CPUs with "
        "native bf16, AVX512-BF16 or AMX) or float16; on a GPU the device's default. onnx: "
        "float32 (default) or int8 (dynamic int8 matmuls, one text a batch).",
    )

    @field_validator("backend")
    @classmethod
    def _check_backend(cls, v: str) -> str:
        check_serves(v, FEATURE_EXTRACTION)
        return v

    @model_validator(mode="after")
    def _check_runtime(self) -> DenseRerankerConfig:
        """A (backend, dtype) pair no runtime computes, in one line before any model loads."""
        if self.backend == "torch" and self.dtype == "int8":
            raise ValueError(
                "dtype int8 is the onnx backend's for a bi-encoder: use backend onnx (or auto) "
                "with it; torch computes in float32 or bfloat16"
            )
        if self.backend == "onnx":
            types = compute_types("onnx", FEATURE_EXTRACTION)
            if self.dtype not in (None, "auto", "fp32", *types):
                raise ValueError(
                    f"dtype {self.dtype} is not a compute type of the onnx backend: one of "
                    f"{', '.join(types)} (bfloat16 runs on backend torch)"
                )
            if self.device not in (None, "auto", "cpu"):
                raise ValueError(f"the onnx backend runs on the CPU here, not on {self.device}")
        return self


class CISRerankerConfig(ComponentConfig):
    """Settings of the CIS reranker (CLI flags, API config file and tests build it alike)."""

    label: ClassVar[str] = "CIS reranker"

    model: str = Field(
        default=DEFAULT_CIS_MODEL,
        description="Causal LM: a Hugging Face id, a local folder or a catalogue name; default "
        f"{DEFAULT_CIS_MODEL} (the catalogue's, pulled on first use), the model of every CIS "
        "figure in bench/RESULTS.md.",
    )
    estimator: Annotated[Estimator, Flag()] = Field(
        default="reverse",
        description="reverse (default): log p(Q|K) under a passage-first template (no prior; "
        "the same CIS up to log p(Q), constant per query); forward: log p(K|Q) - log p(K) "
        "(prior offline); both: the mean of the two. Chosen on DL21 (bench/RESULTS.md, "
        "'Choosing the estimator on DL21': reverse upr 0.5086 nDCG@10 at depth 20 against "
        "forward 0.4470 at best); DL19 at depth 100: 0.5860.",
    )
    template: Annotated[str, Flag()] = Field(
        default="qa",
        description="Query template of the forward estimator: qa (default, the paper's "
        "'Question: Q Answer:' form), plain, chat (the tokenizer's chat template), or a custom "
        "string holding {query}. On DL21 (depth 20) forward qa 0.4391, plain 0.4207, chat 0.4470 "
        "with an instruction-tuned model (bench/RESULTS.md).",
    )
    reverse_template: Annotated[str, Flag()] = Field(
        default="upr",
        description="Passage-first template of the reverse estimator: upr (default; 0.5086 on "
        "DL21 at depth 20 against chat's 0.5043, bench/RESULTS.md), chat, or a custom string "
        "holding {passage} and ending with {query}.",
    )
    max_doc_tokens: Annotated[int, Flag()] = Field(
        default=512, ge=1, description="Passage tokens kept."
    )
    batch_size: int | None = Field(default=None, ge=1, description="Passages per batch at most.")
    batch_tokens: int | None = Field(default=None, ge=1, description="Padded tokens per batch.")
    max_padding: float | None = Field(
        default=None, ge=0.0, lt=1.0, description="Padding a row may carry (0.05 CPU, 0.25 GPU)."
    )
    device: str | None = Field(
        default=None, description="torch device (cpu, cuda, cuda:1); unset: CUDA when present."
    )
    backend: Annotated[BackendName, Flag()] = Field(
        default="torch",
        description="Runtime of the causal LM: torch (exact, CPU or GPU), ctranslate2 or onnx "
        "(CPU; extras of those names; measured in bench/lm_backends.py); auto: torch on a GPU, "
        "with an explicit float --dtype or on a CPU with native bf16, else onnx int8 on a CPU "
        "with the onnx extra (faster, scores move by quantization noise), or what "
        "$CISRANK_LM_BACKEND names.",
    )
    dtype: Annotated[str | None, Flag()] = Field(
        default=None,
        description="Compute type: float32 or bfloat16/float16 for torch (default bf16 on a "
        "GPU and on a CPU with native bf16, AVX512-BF16 or AMX, unless CISRANK_CPU_BF16=0; "
        "float32 on other CPUs; float32 gives the exact scores); float32, int8_float32 or int8 "
        "for ctranslate2; float32 or int8 for onnx.",
    )
    prior_store: Annotated[str | None, Flag(path=True)] = Field(
        default=None,
        description="Stored log p(K): a SQLite file (created if absent, caches new passages), a "
        "Parquet prior table or a prior index folder (read-only), or several comma-separated "
        "(tables first, one SQLite file last).",
    )
    normalize: Annotated[Literal["sum", "mean"], Flag()] = Field(
        default="sum",
        description="'sum' of the passage's token log-probabilities, or their 'mean'.",
    )
    padding_side: Literal["right", "left"] = Field(
        default="right",
        description="The side short rows are padded on (scores do not depend on it).",
    )
    prior: bool = Field(
        default=True,
        description="Subtract log p(K) (the paper's CIS). false: log p(K|Q) alone, the paper's "
        "ablation 'w/o p(K)' (Table 4: about 40% of EM/F1 lost on 2Wiki), which favours "
        "passages the LM finds likely whatever the question; the forward estimator only (the "
        "reverse one, log p(Q|K), has no prior term) and no prior is computed or stored.",
    )

    ESTIMATE_FIELDS: ClassVar[frozenset[str]] = frozenset({"estimator", "prior", "normalize"})
    """The options that only combine the sums the model computes (`sides`, `estimate`): CIS
    settings that differ in these alone read the same model passes."""

    SIDE_IGNORES: ClassVar[Mapping[str, frozenset[str]]] = {
        "conditional": frozenset({"reverse_template", "prior_store"}),
        "prior": frozenset({"template", "reverse_template"}),
        "query_likelihood": frozenset({"template", "prior_store"}),
    }
    """The options a side's sums do not read: log p(K|Q) is the forward template's, log p(Q|K)
    the reverse template's, and log p(K) ([BOS] + the passage, `CISReranker._prior_raw`) is
    neither's. So a grid over templates computes each passage's prior once."""

    QUERY_FREE_SIDES: ClassVar[frozenset[str]] = frozenset({"prior"})
    """Sides that do not depend on the query: log p(K) is one number per passage, whichever
    question it is a candidate of."""

    def side_setting(self, side: str) -> dict[str, object]:
        """What `side`'s sums depend on besides the model and the pair: every option with its
        default filled in (so `template: qa` and no template are one setting), less the
        `ESTIMATE_FIELDS` and what the side ignores (`SIDE_IGNORES`). Stored sums are keyed by
        it (`cisrank eval rag`)."""
        if side not in self.SIDE_IGNORES:
            raise ValueError(f"unknown CIS side {side!r}: {sorted(self.SIDE_IGNORES)}")
        skip = self.ESTIMATE_FIELDS | self.SIDE_IGNORES[side] | {"model"}
        return {k: v for k, v in self.model_dump(mode="json").items() if k not in skip}

    def sides(self) -> tuple[str, ...]:
        """The summed log-probabilities this setting's estimate reads, per (query, passage):
        `conditional` log p(K|Q), `prior` log p(K), `query_likelihood` log p(Q|K)."""
        forward = ("conditional", "prior") if self.prior else ("conditional",)
        return {
            "forward": forward,
            "reverse": ("query_likelihood",),
            "both": (*forward, "query_likelihood"),
        }[self.estimator]

    def estimate(self, parts: Sequence[Mapping[str, float]]) -> list[float]:
        """This setting's CIS estimate of each pair from its `sides` (with `doc_tokens` and
        `query_tokens`, the counts `mean` divides by): forward log p(K|Q) - log p(K) (the
        paper's Eq. 1; log p(K|Q) alone with `prior` off, its Table 4 ablation), reverse
        log p(Q|K) (Bayes: the same CIS up to log p(Q), constant per query), both their mean."""
        mean = self.normalize == "mean"

        def forward(p: Mapping[str, float]) -> float:
            value = p["conditional"] - p["prior"] if self.prior else p["conditional"]
            return value / max(p["doc_tokens"], 1) if mean else float(value)

        def reverse(p: Mapping[str, float]) -> float:
            value = p["query_likelihood"]
            return value / max(p["query_tokens"], 1) if mean else float(value)

        if self.estimator == "forward":
            return [forward(p) for p in parts]
        if self.estimator == "reverse":
            return [reverse(p) for p in parts]
        return [(forward(p) + reverse(p)) / 2.0 for p in parts]

    @model_validator(mode="after")
    def _prior_needs_forward(self) -> CISRerankerConfig:
        if not self.prior and self.estimator == "reverse":
            raise ValueError(
                "prior false is the forward estimator without log p(K); the reverse estimator "
                "has no prior term: use estimator forward (or both)"
            )
        return self

    @field_validator("template")
    @classmethod
    def _check_template(cls, v: str) -> str:
        resolve_forward(v)
        return v

    @field_validator("reverse_template")
    @classmethod
    def _check_reverse_template(cls, v: str) -> str:
        resolve_reverse(v)
        return v


def reverse_only(config: CISRerankerConfig) -> bool:
    """Whether CIS scores with the reverse estimator alone, which runs a passage's context once
    for every query that has it: the CIS kind's `passage_major` (`cisrank.rerank.registry`), and
    the CIS reranker's (the forward estimator continues one query's prefix with its passages,
    so `both` is query-major)."""
    return config.estimator == "reverse"


class CrossEncoderRerankerConfig(ComponentConfig):
    """Settings of the cross-encoder reranker (CLI flags, API config file and tests alike)."""

    label: ClassVar[str] = "cross-encoder"

    model: str | None = Field(
        default=STUDENT_MODEL,
        description="A sentence-transformers CrossEncoder with one logit: a folder (the output of "
        f"distillation training), a hub id, or {STUDENT_MODEL} (default), the student shipped "
        "with cisrank.",
    )
    batch_size: int | None = Field(
        default=None,
        ge=1,
        description="Pairs per model batch; on a CPU "
        + ", ".join(
            f"{CPU_BATCH_SIZE[name]} with {name}" for name in names(SEQUENCE_CLASSIFICATION)
        )
        + f" and {CPU_BATCH_SIZE['int8']} in int8 (a dynamic int8 score then depends on its pair "
        f"alone; measured, bench/RESULTS.md), {GPU_BATCH_SIZE} on GPU when unset.",
    )
    max_length: int | None = Field(
        default=None,
        ge=2,
        description="Tokens per (query, passage) pair, truncated longest-first; the model's own "
        "limit when unset.",
    )
    device: str | None = Field(
        default=None, description="torch device (cpu, cuda, cuda:1); unset: CUDA when present."
    )
    # backend and dtype share their flags with the CIS reranker's: the same field type, and the
    # help shows the first kind's description.
    backend: Annotated[BackendName, Flag()] = Field(
        default="auto",
        description="auto (default): onnx int8 on a CPU where onnxruntime is installed (extra "
        "'onnx') and no dtype or quantization is asked for, torch otherwise (GPUs included), or "
        "what $CISRANK_ENCODER_BACKEND names; measured for the kept student at 2.29x torch "
        "float32 and 1.22x torch bf16, DL19 nDCG@10 0.6542 against float32's 0.6486 "
        "(bench/RESULTS.md, 'The two-pass student'). torch: exact float32 (or bf16) scores, CPU "
        "or GPU; onnx: exported once to ONNX and run by ONNX Runtime (CPU).",
    )
    dtype: Annotated[str | None, Flag()] = Field(
        default=None,
        description="torch: float32, bfloat16 or float16; auto: bf16 on GPU (fp16 without bf16 "
        "support) and on CPUs with native bf16 (AVX512-BF16, AMX), float32 on other CPUs and "
        "with --quantize int8. onnx: float32 (default) or int8 (dynamic int8 matmuls).",
    )
    quantize: Annotated[Literal["none", "int8"], Flag()] = Field(
        default="none",
        description="int8: dynamic int8 quantization of the encoder's Linear layers (torch "
        "backend, CPU only; faster, scores move by quantization noise).",
    )

    @field_validator("backend")
    @classmethod
    def _check_backend(cls, v: str) -> str:
        check_serves(v, SEQUENCE_CLASSIFICATION)
        return v


class StudentRerankerConfig(CrossEncoderRerankerConfig):
    """The cross-encoder with the student that ships with cisrank as its model: `--reranker
    student` is `--reranker cross-encoder --model cisrank-student`, option for option."""

    label: ClassVar[str] = "student reranker"

    model: str | None = Field(
        default=STUDENT_MODEL,
        description=f"The student's folder; default {STUDENT_MODEL}, shipped with cisrank (DL19 "
        "nDCG@10 0.6458 and DL21 0.5505 on its ONNX Runtime int8 default, bench/RESULTS.md).",
    )


class HybridRerankerConfig(ComponentConfig):
    """Which scorers are fused, with which weights and method."""

    label: ClassVar[str] = "hybrid reranker"

    fuse: Annotated[str, Flag()] = Field(
        default=DEFAULT_HYBRID_FUSE,
        description="Components and weights, 'KIND:W,...': reranker kinds (cis, dense, "
        "cross-encoder, student) and first-stage (the input order). --model goes to the first "
        f"component that takes a model. Default {DEFAULT_HYBRID_FUSE}, linear: chosen on DL21 "
        "by 5-fold cross-validation (bench/hybrid_select.py --cv 5; CV nDCG@10 0.5448 at depth "
        "20, DL19 0.6074 at depth 20, bench/RESULTS.md).",
    )
    fusion: Annotated[Method, Flag()] = Field(
        default="linear",
        description="linear: weighted sum of per-query normalized scores; rrf: sum of w/(k+rank).",
    )
    fusion_normalize: Normalization = Field(
        default="minmax", description="Per-query normalization of linear fusion."
    )
    rrf_k: float = Field(default=RRF_K, ge=0.0, description="RRF's k.")
    models: dict[str, str] = Field(
        default_factory=dict,
        description="Model per component kind, for components other than the one --model names.",
    )

    @field_validator("fuse")
    @classmethod
    def _check_fuse(cls, v: str) -> str:
        try:
            parse_weights(v)
        except ValueError as exc:
            raise ValueError(f"--fuse: {exc}") from None
        return v
