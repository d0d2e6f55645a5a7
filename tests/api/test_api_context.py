"""POST /v1/context through the HTTP stack with a tiny CIS reranker: the library's result, the
model-thread rule, and 4xx naming the field."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from api_fakes import FUZZ_CLIENT_TIMEOUT_S, OverlapReranker, config_for

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.context import ContextAssembler, sample_noise
from cisrank.data.types import Passage
from cisrank.serving.config import BatchingConfig

QUESTION = "when was the author of hamlet born ?"
TITLES = ["Hamlet", "Shakespeare", "Denmark", "Paris", "Fleas"]


@pytest.fixture(scope="module")
def cis(tiny_gpt2_dir):
    from cisrank.rerank.cis import CISReranker

    return CISReranker(model=str(tiny_gpt2_dir), template="qa")


def _docs(k: int) -> list[dict]:
    return [
        {"text": testing.SAMPLE_SENTENCES[i], "title": TITLES[i], "id": f"d{i}"} for i in range(k)
    ]


def _passages(docs: list[dict]) -> list[Passage]:
    return [Passage(d["id"], d["text"], d["title"]) for d in docs]


class _Watch:
    """Wraps an engine's scoring entry points: which threads ran them, how many at once, and
    how many prompts each `score_spans` call held."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.lock = threading.Lock()
        self.active = 0
        self.most = 0
        self.threads: set[str] = set()
        self.span_calls: list[int] = []
        self._orig = {n: getattr(engine, n) for n in ("score_spans", "score_continuations")}
        for name, fn in self._orig.items():
            setattr(engine, name, self._wrap(name, fn))

    def _wrap(self, name, fn):
        def run(items, *args, **kwargs):
            with self.lock:
                self.active += 1
                self.most = max(self.most, self.active)
                self.threads.add(threading.current_thread().name)
                if name == "score_spans":
                    self.span_calls.append(len(items))
            try:
                return fn(items, *args, **kwargs)
            finally:
                with self.lock:
                    self.active -= 1

        return run

    def restore(self) -> None:
        for name in self._orig:
            delattr(self.engine, name)


@pytest.fixture
def watch(cis):
    w = _Watch(cis.engine)
    yield w
    w.restore()


def test_curvature_with_noise_and_pmi_equals_the_library(make_client, cis, watch):
    # 200 tokens per model call: the 5 rotations (about 100 tokens each) go in several slices
    client = make_client({"cis": cis}, batching=BatchingConfig(max_batch_tokens=200))
    docs = _docs(5)
    pool = [{"text": s, "id": f"n{i}"} for i, s in enumerate(testing.SAMPLE_SENTENCES)]
    body = {
        "query": QUESTION,
        "documents": docs,
        "arrange": "curvature",
        "pmi": True,
        "noise": {"n": 2, "seed": 3, "documents": pool},
    }
    r = client.post("/v1/context", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    threads, most, span_calls = set(watch.threads), watch.most, list(watch.span_calls)

    asm = ContextAssembler(cis.engine, "qa")
    noise = sample_noise([Passage(p["id"], p["text"]) for p in pool], 2, 3, exclude=_passages(docs))
    want = asm.arrange(QUESTION, _passages(docs), "curvature", noise=noise, pmi=True)
    assert out["model"] == "cis" and out["arrange"] == "curvature" and out["template"] == "qa"
    assert out["order"] == want.order
    assert out["scores"] == pytest.approx(want.scores, abs=1e-5)
    assert [c["order"] for c in out["candidates"]] == [c.order for c in want.candidates]
    got_l = [c["mean_logprob"] for c in out["candidates"]]
    assert got_l == pytest.approx([c.mean_logprob for c in want.candidates], abs=1e-5)
    assert out["prompt"] == want.prompt.text
    assert out["gauge"] == pytest.approx(want.gauge.to_json(), abs=1e-5)
    assert set(out["gauge"]) == {"mean_logprob", "logprob", "num_tokens", "pmi"} | {
        "mean_logprob_no_context"
    }
    # noise first (never a document's text: the pool's first 5 are the documents), then the order
    assert [n["id"] for n in out["noise"]] == [p.docid for p in noise]
    assert {p.docid for p in noise} <= {f"n{i}" for i in range(5, 10)}
    assert out["ids"] == [p.docid for p in noise] + [f"d{i}" for i in want.order]
    assert out["usage"] == {
        "documents": 5,
        "noise": 2,
        "prompts_scored": 7,  # 5 rotations, the final prompt, the prompt without passages
        "prompt_tokens": len(want.prompt.ids),
    }
    # every model call in the reranker's one model thread, never two at once, in slices
    assert threads == {"cisrank-cis_0"} and most == 1
    assert len(span_calls) >= 3 and max(span_calls) < 5
    # seeded: the same request, the same answer
    again = client.post("/v1/context", json=body).json()
    assert {k: v for k, v in again.items() if k != "id"} == {
        k: v for k, v in out.items() if k != "id"
    }


@pytest.mark.parametrize("arrange", ["ranked", "reverse", "edges", "likelihood_select"])
def test_other_arrangements_equal_the_library(make_client, cis, arrange):
    client = make_client({"cis": cis})
    docs = [testing.SAMPLE_SENTENCES[i] for i in range(4)]  # plain strings: no ids, no titles
    r = client.post(
        "/v1/context",
        json={"query": QUESTION, "documents": docs, "arrange": arrange, "template": "noise"},
    )
    assert r.status_code == 200, r.text
    out = r.json()
    passages = [Passage(str(i), t) for i, t in enumerate(docs)]
    want = ContextAssembler(cis.engine, "noise").arrange(QUESTION, passages, arrange)
    assert out["order"] == want.order and out["prompt"] == want.prompt.text
    assert out["ids"] == [None] * 4 and out["scores"] is None and out["noise"] == []
    assert out["gauge"]["mean_logprob"] == pytest.approx(want.gauge.mean_logprob, abs=1e-5)
    assert len(out["candidates"]) == (4 if arrange == "likelihood_select" else 0)


def test_context_and_rerank_share_the_model_thread_never_at_once(cis, watch):
    app = create_app(config_for(["cis"]), rerankers={"cis": cis})

    async def run():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as c:
            ctx = {"query": QUESTION, "documents": _docs(4), "arrange": "pmi_rotation"}
            rr = {"query": QUESTION, "documents": testing.SAMPLE_SENTENCES[:6]}
            return await asyncio.gather(
                *(c.post("/v1/context", json=ctx) for _ in range(3)),
                *(c.post("/v1/rerank", json=rr) for _ in range(3)),
            )

    rs = asyncio.run(run())
    assert [r.status_code for r in rs] == [200] * 6, [r.text for r in rs]
    assert len({r.text.split('"prompt"')[1] for r in rs[:3]}) == 1
    assert watch.most == 1 and len(watch.threads) == 1


def _error(r) -> tuple[int, str, str]:
    body = r.json()
    return r.status_code, body["fields"][0]["field"] if body["fields"] else "", body["message"]


def test_bad_requests_get_4xx_naming_the_field(cis, tiny_gpt2_dir):
    from fastapi.testclient import TestClient

    from cisrank.serving.config import RerankerSpec, ServerConfig

    # the served spec names the model's folder, as `cisrank serve` has it: never shown to clients
    specs = {
        "cis": RerankerSpec(kind="cis", model=str(tiny_gpt2_dir)),
        "dense": RerankerSpec(kind="dense", model="m"),
    }
    app = create_app(
        ServerConfig(rerankers=specs), rerankers={"cis": cis, "dense": OverlapReranker()}
    )
    client = TestClient(app, raise_server_exceptions=False)
    many = [testing.SAMPLE_SENTENCES[i % 10] + f" {i}" for i in range(100)]
    base = {"query": QUESTION, "documents": _docs(3)}
    cases = [
        ({"documents": []}, "documents", "at least 1"),
        ({"documents": ["  "]}, "documents.0", "empty"),
        ({"arrange": "sideways"}, "arrange", "curvature"),
        ({"template": "{intro} {documents} {question}"}, "template", "unknown field '{intro}'"),
        ({"template": "no fields here"}, "template", "neither a named one"),
        ({"document_format": "{text} {score}"}, "document_format", "unknown field '{score}'"),
        # 100 passages overflow the tiny model's 1024 positions (one prompt: ranked)
        ({"documents": many}, "documents", "more than the context of"),
        ({"documents": many, "arrange": "curvature"}, "documents", "more than the context of"),
        ({"model": "dense"}, "model", "has no causal language model"),
        ({"model": "nope"}, "model", "is not served here"),
        ({"chat": True}, "chat", "no chat template"),
        ({"noise": {"n": 2}}, "noise", "either 'documents' or 'index'"),
        ({"noise": {"n": 2, "documents": ["x y"]}}, "noise.n", "only 1 distinct"),
        ({"noise": {"n": 1, "index": "wiki"}}, "noise.index", "not served here"),
        ({"noise": {"n": -1, "documents": ["x"]}}, "noise.n", "greater than or equal"),
        ({"shuffles": -1}, "shuffles", "greater than or equal"),
        ({"query": "   "}, "query", "empty"),
    ]
    for change, field, message in cases:
        r = client.post("/v1/context", json={**base, **change})
        status, got_field, got_message = _error(r)
        assert (status, got_field) == (422, field), (change, r.text)
        assert message in got_message or message in r.text, (change, r.text)
        assert str(tiny_gpt2_dir) not in r.text  # the model's folder is never shown


def test_cost_budget_and_default_model(make_client, cis):
    from cisrank.serving.config import Limits

    # a dense default: a request naming no model goes to the CIS reranker
    client = make_client(
        {"dense": OverlapReranker(), "cis": cis},
        limits=Limits(max_request_cost=600),
        batching=BatchingConfig(max_inflight_cost=600),
    )
    ok = client.post("/v1/context", json={"query": QUESTION, "documents": _docs(2)})
    assert ok.status_code == 200 and ok.json()["model"] == "cis", ok.text
    big = {"query": QUESTION, "documents": _docs(5), "arrange": "curvature"}
    status, field, message = _error(client.post("/v1/context", json=big))
    assert (status, field) == (422, "documents") and "over the limit of 600" in message


def test_noise_from_a_served_index(make_client, cis):
    from cisrank.context import sample_store_noise

    class Docs:
        def __init__(self):
            self.texts = [f"{s} ({i})" for i, s in enumerate(testing.SAMPLE_SENTENCES)]

        def __len__(self):
            return len(self.texts)

        def get(self, rows):
            return [(f"w{i}", self.texts[i]) for i in rows]

    class Index:
        name = "bm25"
        docs = Docs()

        def search(self, query, k=10):
            return []

        def batch_search(self, queries, k=10):
            return [[] for _ in queries]

    client = make_client({"cis": cis}, retrievers={"wiki": Index()})
    body = {
        "query": QUESTION,
        "documents": _docs(2),
        "arrange": "reverse",
        "noise": {"n": 3, "seed": 5, "index": "wiki"},
    }
    r = client.post("/v1/context", json=body)
    assert r.status_code == 200, r.text
    want = sample_store_noise(Docs(), 3, 5, exclude=_passages(_docs(2)))
    out = r.json()
    assert out["ids"] == [p.docid for p in want] + ["d1", "d0"]
    assert [n["text"] for n in out["noise"]] == [p.text for p in want]
    assert out["usage"]["noise"] == 3


def test_reserve_admits_like_a_score_request():
    from cisrank.serving.batching import BatchScorer, QueueFullError

    scorer = BatchScorer(OverlapReranker(), "m", BatchingConfig(max_queue=2, max_inflight_cost=100))

    async def run():
        async with scorer.reserve(60):
            assert (scorer.depth, scorer.inflight_cost) == (1, 60)
            with pytest.raises(QueueFullError, match="budget of 100"):
                async with scorer.reserve(41):
                    pass
            async with scorer.reserve(40):  # fits the budget; now the queue is full
                with pytest.raises(QueueFullError, match="2 requests are already waiting"):
                    await scorer.score("q", ["p"])
        assert (scorer.depth, scorer.inflight_cost) == (0, 0)
        async with scorer.reserve(10_000):  # nothing in flight: always admitted
            pass
        await scorer.aclose()
        with pytest.raises(QueueFullError, match="shutting down"):
            async with scorer.reserve(1):
                pass

    asyncio.run(run())


def test_a_request_past_its_timeout_is_503_with_retry_after(make_client, cis):
    client = make_client({"cis": cis}, batching=BatchingConfig(request_timeout_s=0.001))
    r = client.post(
        "/v1/context", json={"query": QUESTION, "documents": _docs(5), "arrange": "curvature"}
    )
    assert r.status_code == 503 and r.json()["error"] == "timeout", r.text
    assert r.headers["retry-after"] == "1"


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_fuzzed_context_requests_never_get_a_5xx(cis, mode):
    """Schemathesis cases for /v1/context alone, scored by the tiny CIS reranker for real."""
    import schemathesis
    from hypothesis import HealthCheck, example, given, settings
    from schemathesis.generation import GenerationMode

    from cisrank.serving.config import Limits

    limits = Limits(max_documents=4, max_document_chars=120, max_query_chars=60)
    app = create_app(config_for(["cis"], limits=limits), rerankers={"cis": cis}, api_keys=[])
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    (op,) = [r.ok() for r in schema.get_all_operations() if r.ok().path == "/v1/context"]
    gen = GenerationMode.POSITIVE if mode == "positive" else GenerationMode.NEGATIVE
    seen: dict[int, int] = {}

    # Schema-valid cases may all be refused by the service's own checks (blank text, an unknown
    # model), and which cases come out moves with every module loaded (Hypothesis mixes in their
    # string constants): one plain request makes sure the positive run reaches the model.
    body = {"query": "who wrote hamlet", "documents": ["a b"]}
    plain = op.Case(body=body, media_type="application/json")

    @given(case=op.as_strategy(generation_mode=gen))
    @example(case=plain)
    @settings(
        max_examples=20,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        response = case.call(timeout=FUZZ_CLIENT_TIMEOUT_S)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, (case.body, response.text)

    check()
    # the fuzzing reached the model (positive) and the validators (negative)
    assert 200 in seen if mode == "positive" else any(400 <= s < 500 for s in seen)
