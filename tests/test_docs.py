"""The README and the docs/ pages a newcomer reads: short, opening with the two commands, and
every relative link pointing at a file or folder of the repository (pages were moved out of
the README, and a moved page must not leave a dead link behind)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = ROOT / "bench" / "RESULTS.md"
LINKED = [*PAGES, RESULTS, *sorted((ROOT / "bench" / "archive").glob("*.md"))]
"""The pages whose relative links must resolve: the README, docs/, and bench/RESULTS.md with the
record it links into."""
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_read_in_five_minutes_and_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    opening = "\n".join(lines[:40])
    assert "make demo" in opening and "make test" in opening


def test_every_relative_link_of_the_readme_and_docs_resolves():
    dead = []
    for page in LINKED:
        text = page.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists():
                dead.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and where.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", where.read_text(encoding="utf-8"), re.M)
                slugs = {
                    re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings
                }
                if anchor not in slugs:
                    dead.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert dead == []


def test_the_results_file_holds_the_current_figures_and_links_the_record():
    """bench/RESULTS.md is the current figure of each claim, read in minutes; the session-by-
    session record is bench/archive/, which it links (the links are checked above)."""
    lines = RESULTS.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 600, len(lines)
    archives = sorted((ROOT / "bench" / "archive").glob("RESULTS-*.md"))
    assert archives
    text = "\n".join(lines)
    for archive in archives:
        assert f"](archive/{archive.name}" in text, archive.name


def test_the_own_data_page_covers_every_file_of_the_example_folder():
    page = (ROOT / "docs" / "own-data.md").read_text(encoding="utf-8")
    files = sorted(p.name for p in (ROOT / "examples" / "own-data").iterdir())
    assert files == [
        "corpus.jsonl",
        "first-stage.json",
        "judgments.txt",
        "questions.jsonl",
        "shots.jsonl",
        "topics.tsv",
    ]
    assert all(f"(../examples/own-data/{name})" in page for name in files)


def test_the_deploy_page_names_every_environment_variable():
    from cisrank import env

    names = sorted(v for k, v in vars(env).items() if k.isupper() and str(v).startswith("CISRANK_"))
    page = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert len(names) == 8 and [n for n in names if f"`{n}`" not in page] == []
