"""Dockerfile and docker-compose.yml, checked without a Docker daemon (none runs here)."""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

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
    assert json.loads(dict(ins)["CMD"])[0] == "serve"
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
    # the config the api service mounts is a valid server config
    host_cfg = next(v.split(":")[0] for v in api["volumes"] if v.startswith("./"))
    assert ServerConfig.load(ROOT / host_cfg).rerankers["dense"].kind == "dense"


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
