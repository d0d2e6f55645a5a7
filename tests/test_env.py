"""`cisrank.env` names every `CISRANK_*` variable cisrank reads; the Docker image and the compose
file set none that it does not (a variable no code reads is a setting that silently does nothing,
as `CISRANK_INDEX_DIR` was)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from cisrank import env

ROOT = Path(__file__).resolve().parents[1]


def _read_by_cisrank() -> set[str]:
    return {v for v in vars(env).values() if isinstance(v, str) and v.startswith("CISRANK_")}


def test_every_variable_the_deployment_sets_is_read():
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    env_lines = re.findall(r"^ENV\b(?:.*\\\n)*.*$", dockerfile, flags=re.MULTILINE)
    image = set(re.findall(r"\b(CISRANK_[A-Z_]+)=", "\n".join(env_lines)))
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    services = [compose["x-common"], *compose["services"].values()]
    containers = {
        name
        for service in services
        for name in service.get("environment", {})
        if name.startswith("CISRANK_")
    }
    assert containers, "the compose file sets no CISRANK_ variable: this test reads it wrong"
    assert (image | containers) - _read_by_cisrank() == set()


def test_env_names_what_the_code_reads():
    """Outside `env.py` no module reads a `CISRANK_*` variable itself."""
    package = Path(env.__file__).parent
    named = _read_by_cisrank()
    for path in package.rglob("*.py"):
        if path.name == "env.py":
            continue
        for found in re.findall(r"\bCISRANK_[A-Z_]+\b", path.read_text(encoding="utf-8")):
            assert found in named, f"{path}: {found} is not named in cisrank/env.py"
