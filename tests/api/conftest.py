"""Fixtures of the API tests: the tiny BERT dense reranker and app/client builders."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient

from cisrank.api.app import create_app
from cisrank.api.http_protocol import ConnectionLimits, GuardedHttpToolsProtocol

# The fakes module is imported by name here and, through PYTHONPATH, by server subprocesses.
sys.path.insert(0, str(Path(__file__).parent))
from api_fakes import config_for


@pytest.fixture(scope="session")
def tiny_dense(tiny_bert_dir):
    from cisrank.rerank.registry import load_reranker

    return load_reranker("dense", str(tiny_bert_dir))


@pytest.fixture(scope="module")
def tiny_cis(tiny_gpt2_dir):
    """A CIS reranker on the tiny GPT-2 (qa template): the causal LM of context assembly."""
    from cisrank.rerank.cis import CISReranker

    return CISReranker(model=str(tiny_gpt2_dir), template="qa")


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


class ThreadServers:
    """uvicorn servers in threads of this process, each on a port the system picks (read back
    once it listens, so no test races another for a port chosen in advance)."""

    def __init__(self) -> None:
        self.running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(self, app, **options) -> int:
        """`app` served with uvicorn `options`; its port, once uvicorn has started."""
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, **options))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        self.running.append((server, thread))
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        return server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        for server, thread in self.running:
            server.should_exit = True
            thread.join(20)


@pytest.fixture
def live_server():
    """`live_server(app)` -> the base URL of `app` served by a real uvicorn on 127.0.0.1 in a
    thread (the whole HTTP stack: h11 parsing, keep-alive, chunked bodies), stopped at the end."""
    servers = ThreadServers()
    yield lambda app: f"http://127.0.0.1:{servers.start(app, log_level='warning')}"
    servers.stop()


@pytest.fixture
def guarded_app():
    """`guarded_app(app, **limits)` -> the port of `app` under an in-process uvicorn with `cisrank
    serve`'s connection protocol (the guarded httptools one; `limits` are `ConnectionLimits`)."""
    servers = ThreadServers()

    def start(app, lifespan: str = "auto", **limits) -> int:
        protocol = GuardedHttpToolsProtocol.with_limits(ConnectionLimits(**limits))
        return servers.start(app, http=protocol, lifespan=lifespan, log_config=None)

    yield start
    servers.stop()
