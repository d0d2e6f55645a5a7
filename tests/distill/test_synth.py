"""`distill synth`: shots, prompts, decoding against a brute-force greedy loop, and which queries
are kept, on a hand-made case."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from cli.helpers import main_in_process

from cisrank.distill.config import SynthConfig
from cisrank.distill.synth import GENERATED, SynthItem, plan_items, sample_order, synthesize
from cisrank.distill.synth_decode import generate_queries, sample, stop_ids
from cisrank.distill.synth_prompt import Shot, clean, draw_shots, read_shots, rejection, render
from cisrank.distill.teachers import TeacherSpec
from cisrank.errors import DataError
from cisrank.lm.backends import load_engine

PASSAGES = {
    "d1": "the cat sat on the mat all day long",
    "d2": "dogs bark at night when the moon is full",
    "d3": "the sun is a star at the centre of the solar system",
    "d4": "rain falls in spring and the rivers rise",
    "d5": "owls hunt mice at night in the forest",
}
SHOTS = [
    ("what is hamlet", "Hamlet is a tragedy by William Shakespeare set in Denmark."),
    ("when did the us enter ww1", "The United States entered World War I in 1917."),
    ("capital of france", "Paris is the capital and largest city of France."),
]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in PASSAGES.items()))
    return path


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    path = tmp_path / "shots.tsv"
    path.write_text("".join(f"{q}\t{p}\tsome negative\n" for q, p in SHOTS))
    return path


def test_shot_files_of_every_shape_read_alike(tmp_path, shots):
    two = tmp_path / "two.tsv"
    two.write_text("".join(f"{q}\t{p}\n" for q, p in SHOTS) + f"{SHOTS[0][0]}\tanother\n")
    lines = tmp_path / "shots.jsonl"
    lines.write_text("".join(json.dumps({"query": q, "passage": p}) + "\n" for q, p in SHOTS))
    want = [Shot(q, p) for q, p in SHOTS]
    assert read_shots(shots) == read_shots(two) == read_shots(lines) == want
    bad = tmp_path / "bad.tsv"
    bad.write_text("only one field\n")
    with pytest.raises(DataError, match=r"bad.tsv:1: expected query<TAB>passage"):
        read_shots(bad)
    # a hostile JSON line is one line naming it, not a RecursionError
    deep = tmp_path / "deep.jsonl"
    nested = '{"query": "q", "passage": "p", "x": ' + "[" * 100 + "]" * 100 + "}"
    deep.write_text(json.dumps({"query": "q", "passage": "p"}) + "\n" + nested + "\n")
    with pytest.raises(DataError, match=r"deep.jsonl:2: JSON nested too deep: at most 64"):
        read_shots(deep)


def test_shots_are_drawn_per_passage_and_query_number_from_the_seed():
    shots = [Shot(f"q{i}", f"p{i}") for i in range(10)]
    first = draw_shots(shots, 3, 12, "d1", 0)
    assert first == draw_shots(list(shots), 3, 12, "d1", 0)  # a function of its arguments
    assert len({s.query for s in first}) == 3
    others = {tuple(s.query for s in draw_shots(shots, 3, 12, "d1", n)) for n in range(1, 6)}
    assert tuple(s.query for s in first) not in others or len(others) > 1
    assert draw_shots(shots, 3, 13, "d1", 0) != first or draw_shots(shots, 3, 12, "d2", 0) != first
    with pytest.raises(DataError, match="--num-shots 11 is more than the 10 examples"):
        draw_shots(shots, 11, 12, "d1", 0)


def test_the_prompt_is_inpars_vanilla_with_cut_passages():
    prompt = render(
        [Shot("who wrote hamlet", "William Shakespeare wrote Hamlet in about 1600.")],
        "Paris is the capital   of France.",
        shot_chars=30,
        passage_chars=1000,
    )
    assert prompt == (
        "Example 1:\nDocument: William Shakespeare wrote\nRelevant Query: who wrote hamlet\n\n"
        "Example 2:\nDocument: Paris is the capital of France.\nRelevant Query:"
    )


def test_replies_are_cleaned_and_judged():
    assert clean(' "what is a star?"\nExample 5:') == "what is a star?"
    assert clean("   ") == ""
    shots = [Shot("What is Hamlet", "p")]
    assert rejection("", shots, 5) == "empty"
    assert rejection("12 34", shots, 5) == "empty"
    assert rejection("one two three four five six", shots, 5) == "long"
    assert rejection("what is hamlet", shots, 5) == "shot"
    assert rejection("what is a star", shots, 5) is None


def _greedy(model, rows: list[list[int]], steps: int, stops: set[int]) -> list[list[int]]:
    """Each row alone, the whole sequence run again at every step, float64 argmax."""
    out = []
    for row in rows:
        ids, got = list(row), []
        for _ in range(steps):
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, -1].double()
            token = int(torch.argmax(logits))
            got.append(token)
            ids.append(token)
            if token in stops:
                break
        out.append(got)
    return out


def test_side_by_side_decoding_is_each_prompt_decoded_alone(tiny_gpt2_bpe_dir):
    from transformers import AutoModelForCausalLM

    engine = load_engine(str(tiny_gpt2_bpe_dir), backend="torch", dtype="float32")
    config = SynthConfig(max_new_tokens=6)
    items = [
        SynthItem(d, 0, render([Shot(q, p)], t, shot_chars=400, passage_chars=600))
        for (d, t), (q, p) in zip(PASSAGES.items(), SHOTS * 2, strict=False)
    ]
    got = generate_queries(engine, items, config)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_gpt2_bpe_dir)).eval()
    rows = [[engine.bos_id, *engine.encode(it.prompt)] for it in items]
    want = _greedy(model, rows, 6, set(stop_ids(engine.tokenizer)))
    tok = engine.tokenizer
    assert [g["text"] for g in got] == [tok.decode(w, skip_special_tokens=True) for w in want]
    assert [(g["docid"], g["n"]) for g in got] == [(it.docid, it.n) for it in items]


def test_sampling_follows_its_own_seeded_generator_and_nucleus():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    gen = torch.Generator().manual_seed(0)
    draws = {sample(logits, 1.0, 0.5, gen) for _ in range(50)}
    assert draws == {0}  # softmax is 0.644, 0.237, 0.087, 0.032: token 0 alone covers 0.5
    gen = torch.Generator().manual_seed(0)
    draws = {sample(logits, 1.0, 0.9, gen) for _ in range(200)}
    assert draws == {0, 1, 2}  # 0.644 + 0.237 < 0.9, with 0.087 more it is 0.968: 3 is cut
    a = [sample(logits, 0.7, 1.0, torch.Generator().manual_seed(5)) for _ in range(3)]
    assert len(set(a)) == 1


def _hand_replies(out: Path, replies: dict[str, str]) -> None:
    """Replace the generated shards' replies by hand-made ones (row counts kept), as a resumed
    run reads them."""
    for path in sorted((out / GENERATED).glob("shard-*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for r in rows:
            r["text"] = replies[r["docid"]]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


REPLIES = {
    "d1": " where did the cat sit on the mat\nExample 6:",  # BM25 finds d1 first: kept
    "d2": " 1234\n",  # no letter: empty
    "d3": " capital of france\n",  # a shot's query echoed (every prompt shows all three)
    "d4": " Where did the CAT sit on the mat\n",  # d1's query again: duplicate
    "d5": " the moon at night\n",  # BM25 ranks d2 (moon, night) above d5: filtered
}


def test_which_queries_are_kept_hand_made(tiny_gpt2_bpe_dir, corpus, shots, tmp_path):
    out = tmp_path / "synth"
    config = SynthConfig(
        generator=str(tiny_gpt2_bpe_dir), max_new_tokens=3, shard_passages=2, seed=13
    )
    assert sample_order(list(PASSAGES), 13) == ["d1", "d5", "d2", "d3", "d4"]  # d1 before d4
    synthesize(corpus, out, config, shots=shots, progress=False)
    assert len(list((out / GENERATED).glob("shard-*.jsonl"))) == 3
    _hand_replies(out, REPLIES)
    summary = synthesize(corpus, out, config, shots=shots, progress=False)
    assert summary["written"] == 5 and summary["kept"] == 1
    assert summary["dropped"] == {"duplicate": 1, "empty": 1, "filter": 1, "shot": 1}
    rows = [json.loads(x) for x in (out / "queries.jsonl").read_text().splitlines()]
    assert sorted((r["qid"], r["dropped"], r["source_rank"]) for r in rows) == [
        ("d1#q0", None, 1),
        ("d2#q0", "empty", None),
        ("d3#q0", "shot", None),
        ("d4#q0", "duplicate", None),
        ("d5#q0", "filter", 2),
    ]
    assert (out / "topics.tsv").read_text() == "d1#q0\twhere did the cat sit on the mat\n"
    assert (out / "qrels.txt").read_text() == "d1#q0 0 d1 1\n"
    (entry,) = json.loads(gzip.decompress((out / "candidates.json.gz").read_bytes()))
    assert entry["query"] == "where did the cat sit on the mat"
    assert entry["hits"][0] == {
        "qid": "d1#q0",
        "docid": "d1",
        "content": PASSAGES["d1"],
        "rank": 1,
        "score": entry["hits"][0]["score"],
    }
    assert [h["rank"] for h in entry["hits"]] == list(range(1, len(entry["hits"]) + 1))

    # another threshold and no filter reuse the ranks on disk; the filter keeps d5 at rank 2
    kept2 = synthesize(corpus, out, config.replace(keep_top=2), shots=shots, progress=False)
    assert kept2["kept"] == 2 and "filter" not in kept2["dropped"]
    open_ = synthesize(corpus, out, config.replace(filter="none"), shots=shots, progress=False)
    assert open_["kept"] == 2 and "filter" not in open_["dropped"]


def test_a_held_out_sets_query_is_never_kept(tiny_gpt2_bpe_dir, corpus, shots, tmp_path):
    out = tmp_path / "synth"
    config = SynthConfig(
        generator=str(tiny_gpt2_bpe_dir), max_new_tokens=3, shard_passages=2, seed=13
    )
    synthesize(corpus, out, config, shots=shots, progress=False)
    _hand_replies(out, REPLIES)
    stamps = {p: p.stat().st_mtime_ns for p in (out / GENERATED).glob("shard-*.jsonl")}
    # d1's query (kept above) is an evaluation query, written in another case and spacing
    held = {"dev": ["Where did the  cat sit on the MAT", "an unrelated query"]}
    summary = synthesize(corpus, out, config, shots=shots, held_out=held, progress=False)
    assert summary["kept"] == 0 and summary["held_out"] == {"dev": 2}
    assert summary["dropped"] == {"empty": 1, "filter": 1, "held-out": 2, "shot": 1}
    rows = {r["qid"]: r for r in map(json.loads, (out / "queries.jsonl").read_text().splitlines())}
    # d4 writes d1's query again: held out too (not a duplicate of a query that was kept)
    assert rows["d1#q0"]["dropped"] == rows["d4#q0"]["dropped"] == "held-out"
    assert (out / "topics.tsv").read_text() == ""
    # judging is not generating: no shard was written again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert len(list((out / GENERATED).glob("shard-*.jsonl"))) == len(stamps)


def test_a_teacher_filter_ranks_the_source_among_the_candidates(
    tiny_gpt2_bpe_dir, corpus, shots, tmp_path
):
    out = tmp_path / "synth"
    config = SynthConfig(
        generator=str(tiny_gpt2_bpe_dir), max_new_tokens=3, filter="teacher", seed=13
    )

    def teacher(name: str, d5_first: bool) -> TeacherSpec:
        # d5's query "the moon at night" retrieves d2 (moon, night) before d5 (night): BM25
        # alone drops it; a teacher that prefers d5 keeps it, one that prefers d2 does not
        prefer = {"d5": 9.0, "d2": 1.0} if d5_first else {"d5": 1.0, "d2": 9.0}
        scores = {"d5#q0": prefer, "d1#q0": {"d1": 4.0}, "d4#q0": {}}
        run = tmp_path / name
        run.write_text(
            "".join(
                f"{q} Q0 {d} 1 {scores[q].get(d, 0.0)} t\n"
                for q in scores
                for d in sorted(PASSAGES)
            )
        )
        return TeacherSpec.of("scores", scores_file=run)

    synthesize(corpus, out, config, shots=shots, teacher=teacher("a.trec", True), progress=False)
    _hand_replies(out, REPLIES)
    for name, d5_first, kept in (
        ("a.trec", True, ["d1#q0", "d5#q0"]),
        ("b.trec", False, ["d1#q0"]),
    ):
        spec = teacher(name, d5_first)
        summary = synthesize(corpus, out, config, shots=shots, teacher=spec, progress=False)
        rows = list(map(json.loads, (out / "queries.jsonl").read_text().splitlines()))
        ranks = {r["qid"]: r["source_rank"] for r in rows}
        assert ranks["d1#q0"] == 1 and ranks["d5#q0"] == (1 if d5_first else 2)
        assert sorted(r["qid"] for r in rows if r["dropped"] is None) == kept
        assert summary["kept"] == len(kept)
    with pytest.raises(DataError, match="--filter teacher needs --filter-teacher"):
        synthesize(corpus, out, config, shots=shots, progress=False)


def test_a_lost_shard_is_written_again_and_the_rest_kept(
    tiny_gpt2_bpe_dir, corpus, shots, tmp_path
):
    out = tmp_path / "synth"
    config = SynthConfig(generator=str(tiny_gpt2_bpe_dir), max_new_tokens=4, shard_passages=2)
    synthesize(corpus, out, config, shots=shots, progress=False)
    before = (out / "queries.jsonl").read_text()
    kept = out / GENERATED / "shard-00000.jsonl"
    stamp = kept.stat().st_mtime_ns
    (out / GENERATED / "shard-00001.jsonl").unlink()
    synthesize(corpus, out, config, shots=shots, progress=False)
    assert (out / "queries.jsonl").read_text() == before
    assert kept.stat().st_mtime_ns == stamp


def test_plan_draws_other_shots_for_each_query_of_a_passage():
    shots = [Shot(f"query {i}", f"passage {i}") for i in range(8)]
    config = SynthConfig(queries_per_passage=2, num_shots=2)
    items = plan_items({"d1": "a passage", "d2": "another"}, shots, config)
    assert sorted((i.docid, i.n) for i in items) == [("d1", 0), ("d1", 1), ("d2", 0), ("d2", 1)]
    assert [i.docid for i in items[::2]] == [i.docid for i in items[1::2]]  # a passage's queries
    assert items[0].prompt != items[1].prompt


def test_a_sample_is_a_prefix_of_every_larger_one_and_its_queries_are_reused(
    tiny_gpt2_bpe_dir, corpus, shots, tmp_path
):
    order = sample_order(list(PASSAGES), 12)
    assert sorted(order) == sorted(PASSAGES) and order == sample_order(sorted(PASSAGES)[::-1], 12)
    assert sample_order(list(PASSAGES), 13) != order
    out = tmp_path / "synth"
    config = SynthConfig(generator=str(tiny_gpt2_bpe_dir), max_new_tokens=3, shard_passages=2)
    small = synthesize(corpus, out, config.replace(passages=2), shots=shots, progress=False)
    assert small["sampled_passages"] == 2 and small["written"] == 2
    first = out / GENERATED / "shard-00000.jsonl"
    stamp, text = first.stat().st_mtime_ns, first.read_text()
    assert [json.loads(x)["docid"] for x in text.splitlines()] == order[:2]
    whole = synthesize(corpus, out, config, shots=shots, progress=False)
    assert whole["written"] == 5 and first.stat().st_mtime_ns == stamp


def test_the_command_line(tiny_gpt2_bpe_dir, corpus, shots, tmp_path, monkeypatch, capsys):
    out = tmp_path / "cli"
    args = ["distill", "synth", "--corpus", str(corpus), "--out", str(out), "--shots", str(shots)]
    args += ["--generator", str(tiny_gpt2_bpe_dir), "--max-new-tokens", "3", "--quiet"]
    res = main_in_process(monkeypatch, capsys, *args, "--workers", "1", "--filter", "none")
    assert res.code == 0, res.err
    summary = json.loads((out / "synth.json").read_text())
    assert res.out.strip().endswith(
        f"{summary['kept']} of 5 queries kept ({summary['kept_passages']} of 5 passages); "
        f"dropped: {', '.join(f'{k} {v}' for k, v in summary['dropped'].items()) or 'none'}"
    )
    bad = main_in_process(monkeypatch, capsys, *args, "--workers", "1", "--filter", "teacher")
    assert bad.code == 2
    assert bad.last_line.endswith(
        "--filter teacher needs --filter-teacher (and its --filter-model)"
    )
