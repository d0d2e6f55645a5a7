"""Fixtures of the API tests: the tiny BERT dense reranker and app/client builders."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cisrank.api.app import create_app

# The fakes module is imported by name here and, through PYTHONPATH, by server subprocesses.
sys.path.insert(0, str(Path(__file__).parent))
from api_fakes import config_for


@pytest.fixture(scope="session")
def tiny_dense(tiny_bert_dir):
    from cisrank.rerank.registry import load_reranker

    return load_reranker("dense", str(tiny_bert_dir))


@pytest.fixture
def make_client():
    """`make_client(rerankers, **config)` -> a started TestClient (lifespan on), closed at the end."""
    clients = []

    def build(rerankers, retrievers=None, api_keys=(), **changes):
        app = create_app(
            config_for(rerankers, **changes),
            rerankers=rerankers,
            retrievers=retrievers,
            api_keys=list(api_keys),
        )
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.__exit__(None, None, None)
