"""Self-distillation data at scale: prompt sources, batched generation, the disk estimate, resume."""
from __future__ import annotations

import ast
import json
import re
import shutil

import pytest
import torch
from scipy.stats import chisquare

from specviz.core.errors import SpecvizError
from specviz.engine.generate import GenerationConfig, baseline_generate, collect
from specviz.modeling import models
from specviz.train import data as data_mod
from specviz.train import prompt_sources as prompts_mod
from specviz.train.command import parse_sources
from specviz.train.data import Corpus, Seq, build_data, bytes_per_token, load_data
from specviz.train.generate import draw, generate, teacher_force, write_and_force
from specviz.train.prompt_sources import (PROMPTS, gather, row, self_written, shares_bench_text, user_header,
                                   user_turn_ok)
from specviz.train.tasks import doc_files, doc_tasks, passages_of

from tiny_folder import make_tiny_model_dir

BENCH = PROMPTS.parents[1] / "bench" / "default.jsonl"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return models.load(str(make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny")), device="cpu")


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    words = "the cat sat on the mat and said hello world to a big red dog".split()
    rows = [{"id": f"p{i}", "prompt": " ".join(words[(i + j) % len(words)] for j in range(3 + i % 11))}
            for i in range(20)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _bench_grams(n=8):
    grams = set()
    for line in BENCH.read_text().splitlines():
        r = json.loads(line)
        for t in r.get("turns") or [{"content": r["prompt"]}]:
            w = re.findall(r"[a-z0-9']+", t["content"].lower())
            grams |= {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}
    return grams


# --- prompt sources ---------------------------------------------------------------------

def test_offline_sources_are_deterministic_labelled_and_share_no_text_with_the_bench():
    a = gather({"code": 30, "docs": 30}, seed=3)
    assert a == gather({"code": 30, "docs": 30}, seed=3)
    assert a != gather({"code": 30, "docs": 30}, seed=4)
    assert {r["source"] for r in a} == {"code", "docs"} and len(a) == 60
    assert len({r["id"] for r in a}) == len(a)
    assert all(r["id"] == row(r["source"], r["category"], r["prompt"])["id"] for r in a)  # named by their text
    bench = _bench_grams()
    for r in a:
        w = re.findall(r"[a-z0-9']+", r["prompt"].lower())
        assert not {tuple(w[i:i + 8]) for i in range(len(w) - 7)} & bench, r["id"]


def test_code_tasks_carry_real_code_and_name_what_to_change():
    for r in gather({"code": 30}, seed=0):
        code = r["prompt"].split("```python\n", 1)[1].rsplit("\n```", 1)[0]
        ast.parse(code)  # a whole function or class from the standard library
        rename = re.search(r"rename `(\w+)` to `(\w+)`|name `(\w+)` to `(\w+)`", r["prompt"])
        if rename:
            old = rename.group(1) or rename.group(3)
            assert re.search(rf"\b{old}\b", code)


def test_doc_passages_come_from_text_files_where_they_exist(tmp_path):
    (tmp_path / "pkg").mkdir()
    readme = tmp_path / "pkg" / "README.txt"
    readme.write_text("A tool that sorts the lines of a file by length.\n\n" + "It reads standard input. " * 20)
    assert readme in doc_files((tmp_path, tmp_path / "missing"))
    assert passages_of(readme) == [readme.read_text().strip()]
    assert all(r["category"] in ("summarisation", "rewriting", "translation") for r in doc_tasks(10, 0, row))


def test_user_turn_filter():
    assert user_turn_ok("How do I make a simple tomato soup for four people?")
    assert not user_turn_ok("Hi there")  # too short
    assert not user_turn_ok("<|im_start|>user\nWhat is the capital of Peru, please?")  # template tokens
    assert not user_turn_ok("Tell me about <b>bold</b> tags now", specials=("<b>",))
    assert not user_turn_ok("the cat the cat the cat the cat the cat the cat the cat")  # a loop
    assert not user_turn_ok("#### 1234 %%%% 5678 //// 9999 ==== $$$$ @@@@")  # not language
    bench = json.loads(BENCH.read_text().splitlines()[0])["turns"][0]["content"]
    assert shares_bench_text(bench) and shares_bench_text("So: " + " ".join(bench.split()[2:10]) + " then")
    assert not shares_bench_text("How do I make a simple tomato soup for four people?")


def test_self_written_user_turns_are_deterministic_and_distinct(tiny, tmp_path):
    assert user_header(tiny.tokenizer) == "<|im_start|>user\n"
    kwargs = dict(batch=8, max_new_tokens=60, keep=lambda text: True, progress=False)
    a = self_written(tiny, 3, seed=1, **kwargs)
    assert a and a == self_written(tiny, 3, seed=1, **kwargs)
    assert len({r["prompt"] for r in a}) == len(a) and {r["source"] for r in a} == {"self"}
    pooled = gather({"self": 3}, seed=1, target_loaded=tiny, cache=tmp_path, **kwargs)
    assert pooled == a and (tmp_path / "prompts-self.jsonl").is_file()
    assert gather({"self": 3}, seed=1, target_loaded=tiny, cache=tmp_path, keep=lambda t: False) == a  # cached


def test_more_self_written_prompts_go_on_from_the_kept_ones(tiny, tmp_path, monkeypatch):
    """Growing the `self` pool draws only the new prompts, and the same ones one call makes."""
    kwargs = dict(batch=16, max_new_tokens=200, keep=lambda text: len(text) % 3 != 0, progress=False)
    whole = self_written(tiny, 9, seed=2, **kwargs)
    assert len(whole) == 9
    small = gather({"self": 3}, seed=2, target_loaded=tiny, cache=tmp_path, **kwargs)
    assert small == whole[:3]
    rounds = []
    real = prompts_mod.self_written
    monkeypatch.setattr(prompts_mod, "self_written", lambda *a, **k: rounds.append(k["resume"]) or real(*a, **k))
    assert gather({"self": 9}, seed=2, target_loaded=tiny, cache=tmp_path, **kwargs) == whole
    assert rounds[0][0] == small and rounds[0][1] >= 0  # went on from the 3 kept, not from scratch
    assert gather({"self": 5}, seed=2, target_loaded=tiny, cache=tmp_path, **kwargs) == whole[:5]
    assert len(rounds) == 1  # fewer than kept: read back, nothing drawn
    assert gather({"self": 9}, seed=3, target_loaded=tiny, cache=tmp_path, **kwargs) == \
        real(tiny, 9, seed=3, **kwargs)  # another seed: drawn afresh


def test_a_self_pool_kept_without_its_round_grows_and_keeps_its_prompts(tiny, tmp_path):
    """Pools written before the stopping round was recorded (first line without "round") grow:
    the kept prompts stay first and the new ones are drawn from rounds that call never drew."""
    kwargs = dict(batch=16, max_new_tokens=200, keep=lambda text: len(text) % 3 != 0, progress=False)
    kept = [row("self", "chat", f"a question kept from an older build, number {i}") for i in range(3)]
    head = {"seed": 2, "target": tiny.name, "n": 3}
    (tmp_path / "prompts-self.jsonl").write_text("\n".join(json.dumps(x) for x in [head, *kept]) + "\n")
    grown = gather({"self": 7}, seed=2, target_loaded=tiny, cache=tmp_path, **kwargs)
    assert grown[:3] == kept and len(grown) == 7
    assert len({r["prompt"] for r in grown}) == 7
    assert grown == self_written(tiny, 7, seed=2, resume=(kept, 4), **kwargs)  # on from round 4 x ceil(3 / 16)
    line = json.loads((tmp_path / "prompts-self.jsonl").read_text().splitlines()[0])
    assert line["n"] == 7 and line["round"] >= 4


# --- generation -------------------------------------------------------------------------

def test_batched_generation_equals_one_at_a_time_greedy(tiny):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, tiny.vocab_size, (n,), generator=g).tolist() for n in (1, 4, 9, 17, 33, 40)]
    eos = list(tiny.eos_token_ids)
    batched = generate(tiny.model, prompts, 24, eos, pad=eos[0])
    assert batched == [generate(tiny.model, [p], 24, eos, pad=eos[0])[0] for p in prompts]
    for p, got in zip(prompts, batched):  # and both are plain greedy decoding
        _, end = collect(baseline_generate(tiny.model, p, GenerationConfig(max_new_tokens=24)))
        assert got == list(end.token_ids)
    sample = lambda: generate(tiny.model, prompts, 24, eos, eos[0], temperature=0.8,  # noqa: E731
                              generator=torch.Generator().manual_seed(5))
    assert sample() == sample()


def test_fast_generation_equals_transformers_when_rows_end_at_different_steps(tiny, monkeypatch):
    """specviz's batched decode (llama_fast over a shared preallocated cache) writes what
    transformers' padded batch writes, greedy and sampled with one seed, when rows end at
    different steps: finished rows wait in the batch, then leave it together (20 rows: the
    cache is compacted once 2 have ended)."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, tiny.vocab_size, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 40, (20,), generator=g)]
    free = generate(tiny.model, prompts, 20, [0], pad=0)  # 0 is never written: every row runs 20
    # eos: tokens some rows write early, so rows finish all along the way
    eos = sorted({r[s] for r, s in zip(free, (2, 5, 9, 13, 17)) if r[s] != 0})
    assert eos and all(0 not in r for r in free)
    for kw in ({}, {"temperature": 0.8}):
        fast = generate(tiny.model, prompts, 20, eos, 0, generator=torch.Generator().manual_seed(7), **kw)
        with monkeypatch.context() as m:
            m.setenv("SPECVIZ_FAST", "0")
            plain = generate(tiny.model, prompts, 20, eos, 0, generator=torch.Generator().manual_seed(7), **kw)
        assert fast == plain
        ends = {len(r) for r in fast if r[-1] in eos}
        assert len(ends) >= 3 and all(len(r) == 20 or r[-1] in eos for r in fast)


def test_writing_and_forcing_in_one_pass_records_what_teacher_forcing_does(tiny):
    """write_and_force: the responses `generate` writes (greedy, and sampled with one seed) and,
    for prompt and response, the hidden states and top-K a teacher-forced forward over the
    finished text gives, also for rows that end early (eos) and rows cut at the length cap."""
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, tiny.vocab_size, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 40, (20,), generator=g)]
    free = generate(tiny.model, prompts, 16, [0], pad=0)
    eos = sorted({r[s] for r, s in zip(free, (1, 4, 8, 12)) if r[s] != 0})
    for kw in ({}, {"temperature": 0.8}):
        pairs = write_and_force(tiny.model, prompts, 16, eos, 8, generator=torch.Generator().manual_seed(9), **kw)
        assert [r for r, _ in pairs] == generate(tiny.model, prompts, 16, eos, 0,
                                                 generator=torch.Generator().manual_seed(9), **kw)
        assert {len(r) for r, _ in pairs if r[-1] in eos} and any(len(r) == 16 for r, _ in pairs)
        seqs = [torch.tensor(q + r) for q, (r, _) in zip(prompts, pairs)]
        for (_, (h, p, i)), (h0, p0, i0), s in zip(pairs, teacher_force(tiny.model, seqs, 8), seqs):
            assert h.shape == h0.shape == (len(s), 32) and p.shape == p0.shape == (len(s), 8)
            assert torch.equal(i, i0)
            torch.testing.assert_close(h, h0, atol=2e-3, rtol=2e-3)
            torch.testing.assert_close(p, p0, atol=2e-3, rtol=2e-3)


def test_on_a_cpu_the_target_writes_its_own_data_unless_told_otherwise(tiny, monkeypatch):
    from specviz.train.command import generation_model

    assert generation_model(tiny, "auto") is tiny.model  # it records its states as it writes
    assert generation_model(tiny, "fp32") is tiny.model
    assert next(generation_model(tiny, "bf16").parameters()).dtype == torch.bfloat16
    monkeypatch.setenv("SPECVIZ_FAST", "0")  # no recording path: a bf16 copy writes, the target forces
    assert next(generation_model(tiny, "auto").parameters()).dtype == torch.bfloat16


def test_sampled_generation_draws_from_the_tempered_distribution():
    """generate's draw: counts over 40,000 rows match the probabilities (chi-square), and a
    token of probability 0 (first, inside, last) is never drawn."""
    probs = torch.tensor([0.0, 0.1, 0.0, 0.25, 0.05, 0.6, 0.0])
    drawn = draw(probs.repeat(40_000, 1), torch.Generator().manual_seed(0))
    counts = torch.bincount(drawn, minlength=len(probs))
    assert counts[probs == 0].sum() == 0
    live = probs > 0
    assert chisquare(counts[live].tolist(), (probs[live] * len(drawn)).tolist()).pvalue > 1e-3
    assert torch.equal(drawn, draw(probs.repeat(40_000, 1), torch.Generator().manual_seed(0)))  # seeded


def test_teacher_forcing_through_specviz_forward_equals_transformers(tiny, monkeypatch):
    """The fast path (llama_fast, a sequence at a time) records what transformers' padded
    batch forward does: the same hidden states and top-K."""
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(3, tiny.vocab_size, (n,), generator=g) for n in (7, 31, 16)]
    fast = teacher_force(tiny.model, seqs, 8)
    monkeypatch.setenv("SPECVIZ_FAST", "0")
    plain = teacher_force(tiny.model, seqs, 8)
    for (h, p, i), (h0, p0, i0), s in zip(fast, plain, seqs):
        assert h.shape == h0.shape == (len(s), 32) and torch.equal(i, i0)
        torch.testing.assert_close(h, h0, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(p, p0, atol=2e-3, rtol=2e-3)


def test_teacher_forced_batch_equals_one_sequence_at_a_time(tiny):
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, tiny.vocab_size, (n,), generator=g) for n in (5, 30, 12)]
    together = teacher_force(tiny.model, seqs, 8, max_tokens=40)  # two forwards: 5+12 padded, then 30
    for s, (h, p, i) in zip(seqs, together):
        h1, p1, i1 = teacher_force(tiny.model, [s], 8)[0]
        assert h.shape == (len(s), 32) and torch.equal(i, i1)
        torch.testing.assert_close(h, h1, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(p, p1, atol=2e-3, rtol=2e-3)


# --- building ---------------------------------------------------------------------------

def test_disk_estimate_matches_the_shards_and_a_full_disk_is_refused(tiny, prompt_file, tmp_path, monkeypatch):
    assert bytes_per_token(576, 32) == 576 * 2 + 32 * 4 + 32 * 2 + 4  # SmolLM2-135M: 1,348 bytes
    said = []
    folder = build_data(tiny, tmp_path / "d", prompts=prompt_file, passes=1, max_new_tokens=40, batch=8,
                        budget_tokens=200, progress=False, log=said.append)
    assert any("bytes per token" in s for s in said)
    meta = json.loads((folder / "meta.json").read_text())
    on_disk = sum((folder / n).stat().st_size for n in meta["shards"])
    per_token = bytes_per_token(tiny.model.config.hidden_size)
    assert per_token <= on_disk / meta["tokens"] < 1.6 * per_token  # plus the files' own overhead
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(SpecvizError, match="not enough disk"):
        build_data(tiny, tmp_path / "e", prompts=prompt_file, passes=1, budget_tokens=10**6, progress=False)
    assert not list((tmp_path / "e").glob("shard-*"))


def test_a_separate_writer_and_the_target_writing_alone_store_the_same_greedy_data(tiny, prompt_file, tmp_path):
    """build_data's two ways: another model object writes and the target forces (two passes), or
    the target writes and records (one pass). With the same fp32 weights both store the same text
    and states."""
    import copy

    kw = dict(prompts=prompt_file, passes=1, max_new_tokens=12, batch=8, budget_tokens=60, progress=False)
    one = load_data(tiny, build_data(tiny, tmp_path / "one", **kw)).sequences
    two = load_data(tiny, build_data(tiny, tmp_path / "two", generate_model=copy.deepcopy(tiny.model), **kw)).sequences
    assert [s.ids.tolist() for s in one] == [s.ids.tolist() for s in two] and one
    for a, b in zip(one, two):
        assert torch.equal(a.top_ids, b.top_ids)
        torch.testing.assert_close(a.hidden.float(), b.hidden.float(), atol=2e-3, rtol=2e-3)


def test_a_token_budget_stops_the_build_and_a_larger_one_continues_it(tiny, prompt_file, tmp_path):
    kw = dict(prompts=prompt_file, passes=2, max_new_tokens=20, batch=4, progress=False)
    build_data(tiny, tmp_path, budget_tokens=60, **kw)
    first = json.loads((tmp_path / "meta.json").read_text())
    assert 60 <= first["response_tokens"] < 60 + 4 * 20
    build_data(tiny, tmp_path, budget_tokens=200, **kw)
    corpus = load_data(tiny, tmp_path)
    keys = [(s.prompt_id, s.variant) for s in corpus.sequences]
    assert len(keys) == len(set(keys)) and corpus.response_tokens >= 200


def test_resume_after_a_killed_run_gives_the_unbroken_result(tiny, prompt_file, tmp_path, monkeypatch):
    kw = dict(prompts=prompt_file, passes=2, max_new_tokens=16, batch=6, progress=False)
    build_data(tiny, tmp_path / "whole", **kw)
    real = data_mod._write_meta

    def killed(folder, meta):  # dies after its third shard is on disk, before meta.json lists it
        if len(meta["shards"]) == 3:
            raise KeyboardInterrupt
        real(folder, meta)

    monkeypatch.setattr(data_mod, "_write_meta", killed)
    with pytest.raises(KeyboardInterrupt):
        build_data(tiny, tmp_path / "split", **kw)
    assert len(list((tmp_path / "split").glob("shard-*.pt"))) == 3  # one shard no meta.json lists
    monkeypatch.setattr(data_mod, "_write_meta", real)
    build_data(tiny, tmp_path / "split", **kw)
    whole, split = load_data(tiny, tmp_path / "whole"), load_data(tiny, tmp_path / "split")
    assert [(s.prompt_id, s.variant) for s in split.sequences] == [(s.prompt_id, s.variant) for s in whole.sequences]
    assert all(torch.equal(a.ids, b.ids) and torch.equal(a.top_ids, b.top_ids)  # sampled passes too
               for a, b in zip(whole.sequences, split.sequences))


def test_held_out_prompts_stay_put_when_generated_sources_grow():
    def seq(pid, source):
        return Seq(torch.tensor([1, 2, 3]), 1, torch.zeros(3, 4), torch.zeros(3, 2), torch.zeros(3, 2), pid,
                   "greedy", source)

    written = [seq(f"w{i}", "written") for i in range(30)]
    small = Corpus(written + [seq(f"code-{i}", "code") for i in range(10)])
    large = Corpus(written + [seq(f"code-{i}", "code") for i in range(500)])
    held = [s.prompt_id for s in small.split(5)[1].sequences]
    assert held == [s.prompt_id for s in large.split(5)[1].sequences] and all(h.startswith("w") for h in held)


def test_cli_sources_and_a_token_budget(tiny, prompt_file, tmp_path, capsys):
    from specviz.cli.main import main as cli_main

    assert parse_sources("written,code:10") == {"written": 0, "code": 10}
    for bad in ("code", "nope:3", "docs:-1", ""):
        with pytest.raises(SpecvizError, match="--sources"):
            parse_sources(bad)
    argv = ["train", "draft", "--target", tiny.source, "--device", "cpu", "--data", str(tmp_path), "--data-only",
            "--prompts", str(prompt_file), "--data-tokens", "50", "--max-new-tokens", "12", "--passes", "1"]
    assert cli_main(argv) == 0
    err = capsys.readouterr().err
    assert "bytes per token" in err and "50 target-written tokens" in err
    assert load_data(tiny, tmp_path).response_tokens >= 50


def test_held_out_prompts_stay_put_when_more_written_prompts_are_answered():
    """Held-out prompts come from the whole written pool: answering more of it later neither
    moves them nor holds out a prompt an earlier run trained on."""
    def seq(pid):
        return Seq(torch.tensor([1, 2, 3]), 1, torch.zeros(3, 4), torch.zeros(3, 2), torch.zeros(3, 2), pid,
                   "greedy", "written")

    pool = [f"w{i}" for i in range(200)]
    few = Corpus([seq(p) for p in pool[:40]], {"written_pool": pool})
    every = Corpus([seq(p) for p in pool], {"written_pool": pool})
    trained_early = {s.prompt_id for s in few.split(10)[0].sequences}
    held_late = {s.prompt_id for s in every.split(10)[1].sequences}
    assert len(held_late) == 10 and not held_late & trained_early
    assert {s.prompt_id for s in few.split(10)[1].sequences} <= held_late
    # without a recorded pool (data built before it was recorded) the choice is among those answered
    assert len(Corpus([seq(p) for p in pool[:40]]).split(10)[1].sequences) == 10


def test_the_build_records_the_written_pool_first(tiny, tmp_path):
    rows = [{"id": f"w{i}", "prompt": f"say {i}", "source": "written"} for i in range(6)]
    rows += [{"id": "code-1", "prompt": "edit this", "source": "code"}]
    build_data(tiny, tmp_path, prompts=rows, passes=1, max_new_tokens=4, batch=4, budget_tokens=1, progress=False)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["written_pool"] == [f"w{i}" for i in range(6)] and len(meta["done"]) < len(rows)
    assert load_data(tiny, tmp_path).meta["written_pool"] == meta["written_pool"]


@pytest.mark.parametrize("bad", [dict(batch=0), dict(max_new_tokens=0), dict(passes=0), dict(top_k=0),
                                 dict(budget_tokens=0), dict(budget_tokens=-5)])
def test_the_build_refuses_sizes_below_one_before_touching_the_folder(tiny, tmp_path, bad):
    rows = [{"id": "w0", "prompt": "say 0"}]
    with pytest.raises(SpecvizError, match="must all be positive"):
        build_data(tiny, tmp_path / "d", prompts=rows, progress=False, **bad)
    assert not (tmp_path / "d").exists()
    build_data(tiny, tmp_path / "d", prompts=rows, passes=1, max_new_tokens=2, batch=1, top_k=1, budget_tokens=None,
               progress=False)  # the smallest sizes, and no token budget, are taken


def test_build_order_takes_turns_by_source_so_a_budget_cut_holds_every_source():
    rows = ([row("written", "chat", f"question {i}") for i in range(12)]
            + [row("docs", "summarisation", f"summarise passage {i}") for i in range(120)]
            + [row("code", "code", f"edit function {i}") for i in range(60)])
    lengths = {r["id"]: len(r["prompt"]) + i % 7 for i, r in enumerate(rows)}
    batches = data_mod.plan(rows, lengths, passes=2, batch=3, seed=5)
    flat = [(p, r["id"]) for b in batches for p, r in b]
    assert sorted(flat) == sorted((p, r["id"]) for p in range(2) for r in rows)  # each once per pass
    assert [p for p, _ in flat] == sorted(p for p, _ in flat)  # pass by pass
    assert data_mod.plan(rows, lengths, 2, 3, 5) == batches  # a pure function: resume rebuilds it
    window = 3 * data_mod.WINDOW  # length sorting stays inside a window: count two whole ones
    head = [r["source"] for b in batches[:2 * window // 3] for _, r in b]
    # 12 turns of all three, then docs and code alternate (a plain shuffle puts about 3 written there)
    assert {s: head.count(s) for s in set(head)} == {"written": 12, "docs": 18, "code": 18}
    assert data_mod.plan(rows, lengths, 1, 3, 6) != data_mod.plan(rows, lengths, 1, 3, 5)


def test_a_grown_pool_builds_whole_batches_and_an_unchanged_one_builds_the_plan():
    """What is left to build: with nothing or whole batches done, the plan itself (same seeds);
    after new prompts joined the pool (part-done batches), whole batches again: every row left
    once, one pass per batch, distinct seeds, none from the plan's whole batches."""
    rows = [row("written", "chat", f"question {i}") for i in range(40)]
    lengths = {r["id"]: 5 + i % 9 for i, r in enumerate(rows)}
    batches = data_mod.plan(rows, lengths, passes=2, batch=4, seed=1)
    assert data_mod.remaining(batches, set(), lengths, 4) == list(enumerate(batches))
    done = {(r["id"], p) for j in (0, 3, 11) for p, r in batches[j]}  # a killed run: whole batches
    assert data_mod.remaining(batches, done, lengths, 4) == [(j, b) for j, b in enumerate(batches)
                                                             if j not in (0, 3, 11)]
    grown = rows + [row("docs", "summarisation", f"summarise passage {i}") for i in range(30)]
    lengths.update({r["id"]: 3 + i % 11 for i, r in enumerate(grown[40:])})
    plan = data_mod.plan(grown, lengths, passes=2, batch=4, seed=1)
    left = data_mod.remaining(plan, done, lengths, 4)
    todo = sorted((p, r["id"]) for b in plan for p, r in b if (r["id"], p) not in done)
    assert sorted((p, r["id"]) for _, b in left for p, r in b) == todo
    assert all(len({p for p, _ in b}) == 1 for _, b in left)
    for p in (0, 1):  # whole batches, but for the plan's own last one and the pool's last one
        assert sum(len(b) < 4 for _, b in left if b[0][0] == p) <= 2
    part_done = sum(0 < sum((r["id"], p) not in done for p, r in b) < len(b) for b in plan)
    assert part_done >= 8 and len(left) <= -(-len(todo) // 4) + 2  # without regrouping: 8+ more
    seeds = [s for s, _ in left]
    assert len(set(seeds)) == len(seeds)
    assert [p for _, b in left for p, _ in b] == sorted(p for _, b in left for p, _ in b)  # pass by pass
