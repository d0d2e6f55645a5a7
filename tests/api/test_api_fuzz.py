"""Property-based fuzzing of the OpenAPI schema (schemathesis + hypothesis): no input gives a 5xx.

Schemathesis turns the app's own /openapi.json into hypothesis strategies for every documented
operation, in positive (schema-valid) and negative (schema-violating) mode; each generated case is
sent through the ASGI app, where the dense reranker on the tiny BERT scores the valid ones for
real. (Its pytest plugin does not run under pytest 9, so hypothesis drives the strategies here.)
Limits are small so that the examples stay cheap on 2 cores.
"""

from __future__ import annotations

import pytest
import schemathesis
from api_fakes import FUZZ_CLIENT_TIMEOUT_S, ListRetriever, config_for
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.serving.config import Limits


@pytest.fixture(scope="module")
def schema(tiny_dense):
    limits = Limits(max_documents=8, max_document_chars=200, max_query_chars=100)
    corpus = {f"d{i}": s for i, s in enumerate(testing.SAMPLE_SENTENCES)}
    app = create_app(
        config_for(["tiny"], limits=limits),
        rerankers={"tiny": tiny_dense},
        retrievers={"toy": ListRetriever(corpus)},
        api_keys=[],
    )
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _operations(schema):
    return [result.ok() for result in schema.get_all_operations()]


def test_schema_documents_the_routes(schema):
    paths = {(op.method.upper(), op.path) for op in _operations(schema)}
    assert {("POST", "/v1/rerank"), ("POST", "/v1/search"), ("GET", "/v1/models")} <= paths


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_input_gives_a_5xx(schema, mode):
    seen: dict[int, int] = {}
    for operation in _operations(schema):
        if mode == GenerationMode.NEGATIVE and operation.method.upper() == "GET":
            continue  # parameterless GETs have no invalid inputs to generate
        if operation.path == "/v2/rerank":
            continue  # /v1/rerank's handler and schema under another path: fuzzed there

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=25,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case):
            response = case.call(timeout=FUZZ_CLIENT_TIMEOUT_S)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (case.path, case.body, response.text)
            if response.status_code >= 400 and response.status_code != 405:
                body = response.json()
                assert body["error"] and body["message"], body

        check()
    # the fuzzing really reached the engine and the validators
    assert 200 in seen if mode == GenerationMode.POSITIVE else any(400 <= s < 500 for s in seen)
