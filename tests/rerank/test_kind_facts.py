"""The registry is the only holder of kind-level facts.

Outside `cisrank/rerank/registry.py` no code tests a reranker kind by its name (`== "cis"`,
`":" in spec.kind`), lists kinds (in code or in a help text) or asks `isinstance` of a reranker
class: it reads the kind's record or the reranker's declared capabilities. The scan below reads
every module's syntax tree; the facts the records declare are checked against the rerankers they
build, and a spec is checked once, when it is made, without importing torch.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

import cisrank
from cisrank.distill.teachers import TEACHERS, TeacherSpec, load_teacher, teacher_kind
from cisrank.errors import CisrankError, DataError, UnknownRerankerError
from cisrank.rerank.configs import HybridRerankerConfig
from cisrank.rerank.registry import KINDS, NONE, available, kind_of, load_reranker
from cisrank.rerank.spec import RerankerSpec

PACKAGE = Path(cisrank.__file__).parent
REGISTRY = PACKAGE / "rerank" / "registry.py"
SCORING = frozenset(KINDS)
NAMES = frozenset(available())  # `none` too: compared with a kind, it is a kind test

# Lists of kind names that are not kind lists: the name and the reason, checked to still exist.
ALLOWED_LISTS = {
    # `distill pack --component NAME=FOLDER`: examples of the names a user gives components
    ("cli/distill.py", "a teacher component (cis, dense, ...)"),
}
ALLOWED_CONSTANTS = {
    # the tag of a cross-encoder's ONNX export folder (a causal LM's export is another graph)
    "ONNX_KIND",
}
FUSE_HELP = ("rerank/configs.py", "reranker kinds (cis, dense, cross-encoder, student)")
"""The hybrid's `--fuse` help cannot import the registry (the registry imports the configs),
so it lists the kinds it fuses itself; `test_the_fuse_help_names_every_kind_a_hybrid_fuses`
holds it to the registry."""

_LIST_RE = re.compile(
    r"\b({0})\b(?:, | or | and |/| \| )\(?\b({0})\b".format(
        "|".join(re.escape(n) for n in sorted(SCORING, key=len, reverse=True))
    )
)


def reranker_classes() -> set[str]:
    """The names of every class in the package that derives from a reranker base class."""
    bases: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else b.attr
                    for b in node.bases
                    if isinstance(b, ast.Name | ast.Attribute)
                )
    found = {"BaseReranker", "CombiningReranker"}
    while True:
        more = {name for name, of in bases.items() if of & found} - found
        if not more:
            return found
        found |= more


def kind_constants() -> dict[str, str]:
    """Module-level names that stand for a kind: bound to a kind's name (`NO_RERANKER =
    NONE.name`, `CIS_TEACHER = "cis"`) or to a registry record (`CIS = RerankerKind(...)`),
    mapped to the kind's name. A comparison with one is a comparison with the name."""
    bound: dict[str, ast.expr] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and t.id not in ALLOWED_CONSTANTS:
                        bound[t.id] = node.value
    out: dict[str, str] = {}
    for name, value in bound.items():
        if isinstance(value, ast.Constant) and value.value in NAMES:
            out[name] = str(value.value)
        elif (
            isinstance(value, ast.Call)
            and getattr(value.func, "id", None) == "RerankerKind"
            and value.args
            and isinstance(value.args[0], ast.Constant)
        ):
            out[name] = str(value.args[0].value)
    for name, value in bound.items():  # `NO_RERANKER = NONE.name`
        of = getattr(value, "value", None)
        if isinstance(value, ast.Attribute) and isinstance(of, ast.Name) and of.id in out:
            out[name] = out[of.id]
    return out


CONSTANTS = kind_constants()


def _names(node: ast.AST) -> set[str]:
    """The kind names a literal (a string, or a tuple, list or set of strings) or a constant
    standing for a kind (`NO_RERANKER`, `CIS`, `CIS.name`) holds."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    found = set()
    for i in items:
        if isinstance(i, ast.Constant) and isinstance(i.value, str):
            found.add(i.value)
        elif isinstance(i, ast.Name) and i.id in CONSTANTS:
            found.add(CONSTANTS[i.id])
        elif (
            isinstance(i, ast.Attribute)
            and isinstance(i.value, ast.Name)
            and i.value.id in CONSTANTS
        ):
            found.add(CONSTANTS[i.value.id])
    return found & NAMES


def _about_kinds(node: ast.AST) -> bool:
    text = ast.unparse(node).lower()
    return any(word in text for word in ("kind", "reranker", "teacher"))


def kind_tests(source: str, classes: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each kind test, kind list or isinstance of a reranker class."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(source)
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for side in operands:
                others = [o for o in operands if o is not side]
                names = _names(side)
                if names & SCORING or (names and any(map(_about_kinds, others))):
                    found.append((node.lineno, f"compares with {sorted(names)}"))
                elif (
                    isinstance(side, ast.Constant)
                    and side.value == ":"
                    and any(map(_about_kinds, others))
                ):
                    found.append((node.lineno, "tests a kind for ':' (a factory path)"))
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and any(
            isinstance(i, ast.Constant) and i.value in SCORING for i in node.elts
        ):
            found.append((node.lineno, f"lists kinds {sorted(_names(node))}"))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in {
            "isinstance",
            "issubclass",
        }:
            of = node.args[1] if len(node.args) > 1 else None
            items = of.elts if isinstance(of, ast.Tuple) else [of]
            named = {i.id if isinstance(i, ast.Name) else getattr(i, "attr", "") for i in items}
            if named & classes:
                found.append((node.lineno, f"isinstance of {sorted(named & classes)}"))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and _LIST_RE.search(node.value)
        ):
            found.append((node.lineno, f"names kinds in a text: {node.value!r}"))
    return found


def test_the_scan_finds_each_shape_it_forbids():
    """The detector itself, on the shapes once counted in the code (so the scan cannot pass by
    finding nothing)."""
    classes = reranker_classes()
    assert {"DenseReranker", "PooledReranker", "CISReranker", "IdentityReranker"} <= classes
    assert {"NO_RERANKER": "none", "CIS": "cis", "CROSS_ENCODER": "cross-encoder"}.items() <= (
        CONSTANTS.items()
    )
    cases = {
        'LM_KINDS = ("cis", "hybrid")': "lists kinds",
        "if spec.kind not in LM_KINDS or spec.kind == 'cis': pass": "compares",
        'if spec.kind == "none": pass': "compares",
        'if ":" in spec.kind: pass': "factory path",
        "if self.name == 'dense': pass": "compares",
        "if kind == NO_RERANKER: pass": "compares",
        "t = CISTeacher if kind is CIS else RerankerTeacher": "compares",
        "if name != CIS.name: pass": "compares",
        "ok = isinstance(local, DenseReranker)": "isinstance",
        "ok = isinstance(r, (PooledReranker, int))": "isinstance",
        'msg = "cannot be served: pick dense, cis, ..."': "names kinds",
        'h = "one per CPU core for the causal-LM kinds (cis, hybrid)"': "names kinds",
    }
    for code, what in cases.items():
        got = kind_tests(code, classes)
        assert got and what in got[0][1], (code, got)
    for code in (
        'if normalize == "none": pass',  # not about kinds
        "if record.keeps_order: pass",
        "ok = isinstance(built, Reranker)",  # the contract, not a class
        'x = {"kind": "cross-encoder"}',  # a recorded value
        'def f():\n    """The dense or cis kind."""',
    ):
        assert kind_tests(code, classes) == [], code


def test_no_kind_is_tested_listed_or_isinstance_checked_outside_the_registry():
    classes = reranker_classes()
    bad = []
    allowed = {*ALLOWED_LISTS, FUSE_HELP}
    used: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == REGISTRY:
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        source = path.read_text(encoding="utf-8")
        for line, what in kind_tests(source, classes):
            text = source.splitlines()[line - 1]
            exempt = {a for a in allowed if a[0] == rel and a[1] in what}
            if exempt and what.startswith("names kinds in a text"):
                used |= exempt
                continue
            bad.append(f"cisrank/{rel}:{line}: {what}: {text.strip()}")
    assert not bad, "read the kind's record or the reranker's capabilities:\n" + "\n".join(bad)
    assert used == allowed  # each exemption still stands for a text that exists


def test_the_fuse_help_names_every_kind_a_hybrid_fuses():
    description = HybridRerankerConfig.model_fields["fuse"].description or ""
    assert FUSE_HELP[1] in description
    listed = set(FUSE_HELP[1].partition("(")[2].rstrip(")").split(", "))
    fusable = {n for n, k in KINDS.items() if not k.fuses and not k.keeps_order}
    assert listed == fusable


def test_the_records_declare_what_their_rerankers_declare(tiny_gpt2_dir, tiny_bert_dir, ce_dir):
    """Each kind's facts against a built reranker: whether it embeds, runs a causal LM and is
    passage-major under the config given."""
    settings = [
        ("cis", tiny_gpt2_dir, {"estimator": "forward", "template": "qa"}),
        ("cis", tiny_gpt2_dir, {"estimator": "reverse"}),
        ("cis", tiny_gpt2_dir, {"estimator": "both"}),
        ("dense", tiny_bert_dir, {}),
        ("cross-encoder", ce_dir, {"backend": "torch"}),
        ("student", ce_dir, {"backend": "torch"}),
        ("hybrid", tiny_bert_dir, {"fuse": "dense:1,first-stage:1"}),
        ("none", None, {}),
    ]
    assert {s[0] for s in settings} == set(available())
    for name, model, options in settings:
        record = kind_of(name)
        built = load_reranker(name, None if model is None else str(model), **options)
        where = f"{name} {options}"
        assert record.passage_major_with(options) == (
            built.passage_major and not built.combines_request
        ), where
        assert record.embeds == (built.embedder is not None), where
        assert record.keeps_order == built.keeps_order, where
        if not record.fuses:  # a fusion's LM is its components', not its own
            assert record.causal_lm == (built.causal_lm is not None), where
    cis = kind_of("cis")  # the default estimator is the reverse one
    assert cis.passage_major_with({}) and not cis.passage_major_with({"estimator": "forward"})


def test_a_spec_is_checked_once_when_made_without_torch():
    code = (
        "import sys\n"
        "from pydantic import ValidationError\n"
        "from cisrank.rerank.spec import RerankerSpec\n"
        "RerankerSpec(kind='cis', options={'estimator': 'forward', 'prior': False})\n"
        "try:\n"
        "    RerankerSpec(kind='cis', options={'estimator': 'reverse', 'prior': False})\n"
        "except ValidationError as exc:\n"
        "    print(exc.errors()[0]['loc'], exc.errors()[0]['msg'])\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    ).stdout.splitlines()
    assert out[0].startswith("('options',)") and "no prior term" in out[0]
    assert out[-1] == "False"
    with pytest.raises(ValidationError) as info:
        RerankerSpec(kind="cis-typo")
    assert info.value.errors()[0]["loc"] == ("kind",)
    assert "unknown reranker 'cis-typo': choose one of none, cis" in str(info.value)
    assert RerankerSpec(kind="pkg.mod:factory", options={"x": 1}).record is None


def test_none_is_a_record_that_keeps_order_and_is_not_served(tmp_path):
    assert NONE.keeps_order and not NONE.servable and NONE.name == available()[0]
    assert [k.servable for k in KINDS.values()] == [True] * len(KINDS)
    assert load_reranker("none", "ignored", estimator="reverse").keeps_order
    from cisrank.cli.serve import server_config
    from cisrank.serving import ServerConfig, preflight

    with pytest.raises(CisrankError, match="kind 'none' keeps the input order: it cannot be se"):
        RerankerSpec(kind="none").build(serving=True)
    with pytest.raises(CisrankError, match="reranker 'x': kind 'none' cannot be served: pick cis"):
        preflight(ServerConfig(rerankers={"x": RerankerSpec(kind="none")}))
    config = tmp_path / "server.json"
    config.write_text('{"rerankers": {"base": {"kind": "none"}}}', encoding="utf-8")
    with pytest.raises(CisrankError, match="reranker 'base': kind 'none' cannot be served"):
        server_config(config)


def test_teachers_are_registry_entries(tiny_gpt2_dir, tiny_bert_dir, tmp_path):
    assert list(TEACHERS) == [
        "cis",
        "cross-encoder",
        "dense",
        "hybrid",
        "student",
        "scores",
        "qrels",
    ]
    assert teacher_kind("scores").reads_file and teacher_kind("qrels").reads_file
    assert not teacher_kind("cis").reads_file
    run = tmp_path / "run.txt"
    run.write_text("q1 Q0 d1 1 2.5 t\n", encoding="utf-8")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 d1 2\n", encoding="utf-8")
    cases = [
        TeacherSpec.of("cis", str(tiny_gpt2_dir), estimator="forward", template="qa"),
        TeacherSpec.of("cis", str(tiny_gpt2_dir), estimator="reverse"),
        TeacherSpec.of("dense", str(tiny_bert_dir)),
        TeacherSpec.of("hybrid", str(tiny_bert_dir), fuse="dense:1,first-stage:1"),
        TeacherSpec.of("scores", scores_file=run),
        TeacherSpec.of("qrels", scores_file=qrels),
    ]
    for spec in cases:  # the spec says what the teacher it builds says
        assert spec.passage_major == spec.load().passage_major, spec
    assert [s.passage_major for s in cases] == [False, True, True, False, False, False]
    with pytest.raises(DataError, match="teacher 'none' has no scores: pick cis, cross-enc"):
        load_teacher("none")
    with pytest.raises(UnknownRerankerError, match="unknown teacher 'bm25': choose one of cis"):
        load_teacher("bm25")
    with pytest.raises(DataError, match="--scores-file is for teacher 'scores', not 'dense'"):
        load_teacher("dense", scores_file=run)
