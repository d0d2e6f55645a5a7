"""The API's contract: `/openapi.json` as the app serves it equals the committed snapshot
`tests/api/data/openapi.json`, so a change to a route, a wire model, a field's limit, default or
description shows up in review as a diff of that file instead of passing unseen.

The snapshot is written by this module, never by hand. When a change of the contract is
intended, refresh it and commit the new file with the change:

    PYTHONPATH=$PWD .venv/bin/python tests/api/test_contract.py

The package's version (`info.version`) is left out: a release is not a change of the contract.
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).with_name("data") / "openapi.json"
REFRESH = "PYTHONPATH=$PWD .venv/bin/python tests/api/test_contract.py"
MAX_DIFF_LINES = 120


def served_openapi() -> dict[str, Any]:
    """`/openapi.json` of an app on the default config (no keys: the schema does not depend on
    them), the version masked."""
    from cisrank.api.app import create_app

    spec = create_app(api_keys=[]).openapi()
    spec["info"]["version"] = "<version>"
    return spec


def as_text(spec: dict[str, Any]) -> str:
    """One canonical text: sorted keys, one value a line, so a diff names the changed field."""
    return json.dumps(spec, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def contract_diff(snapshot: str, served: str) -> str:
    """A unified diff, snapshot to served, cut to `MAX_DIFF_LINES` lines; empty when equal."""
    lines = list(
        difflib.unified_diff(
            snapshot.splitlines(keepends=True),
            served.splitlines(keepends=True),
            fromfile=str(SNAPSHOT.relative_to(SNAPSHOT.parents[3])),
            tofile="/openapi.json (served)",
            n=4,
        )
    )
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"... {len(lines) - MAX_DIFF_LINES} more lines\n"]
    return "".join(lines)


def test_openapi_equals_the_committed_snapshot():
    served = as_text(served_openapi())
    diff = contract_diff(SNAPSHOT.read_text(encoding="utf-8"), served)
    assert not diff, (
        "/openapi.json differs from the committed snapshot:\n\n"
        f"{diff}\nIf the change is intended, refresh the snapshot and commit it: {REFRESH}"
    )


def test_a_changed_field_shows_as_a_diff_that_names_it():
    """The comparison has teeth: one changed limit is one readable hunk naming the field."""
    spec = served_openapi()
    snapshot = as_text(spec)
    rerank = spec["components"]["schemas"]["RerankRequest"]["properties"]
    assert "top_n" in rerank, sorted(rerank)
    changed = json.loads(snapshot)
    changed["components"]["schemas"]["RerankRequest"]["properties"]["top_n"]["description"] = "x"
    diff = contract_diff(snapshot, as_text(changed))
    removed = [
        line for line in diff.splitlines() if line.startswith("-") and '"description"' in line
    ]
    added = [line for line in diff.splitlines() if line.startswith("+ ")]
    assert len(removed) == 1 and "Return only the best N" in removed[0]
    assert [line[1:].strip() for line in added] == ['"description": "x",']
    assert "tests/api/data/openapi.json" in diff.splitlines()[0]
    assert contract_diff(snapshot, snapshot) == ""


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(as_text(served_openapi()), encoding="utf-8")
    print(f"wrote {SNAPSHOT}")
