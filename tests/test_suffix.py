"""Suffix decoding (drafters/suffix.py, suffix_index.py, suffix_memory.py): the counts its
drafts come from, the memory across requests, and exactness like every drafter."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from conftest import noisy_copy, tiny_llama
from specviz import DraftModel, GenerationConfig, LayerSkip, Sampling, baseline_generate, collect
from specviz import speculative_generate
from specviz.core.errors import SpecvizError
from specviz.run.spec import make_drafter, parse
from specviz.drafters.hybrid import MODEL, Hybrid
from specviz.drafters.suffix import Suffix
from specviz.drafters.suffix_index import Occurrence, SuffixIndex, best_match, continuations
from specviz.drafters.suffix_memory import SuffixMemory, process_memory
from specviz.engine.generate import warm_up
from test_sampling_distribution import N, PROMPT, SAMPLING, assert_matches, exact_joint

# A prompt whose second half repeats its first: the request's own index has matches.
REPEATS = [5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 5, 6, 7, 30, 31, 5, 6, 7]


def index_of(*seqs) -> SuffixIndex:
    index = SuffixIndex()
    for i, s in enumerate(seqs):
        index.extend(i, s)
    return index


# -- the structure ------------------------------------------------------------------------

def test_occurrences_say_how_far_back_the_context_matched():
    index = index_of([1, 2, 3, 9, 2, 3, 7], [0, 3, 5])
    found = index.occurrences([4, 2, 3], max_depth=8)
    # newest sequence first; "3" at the end of sequence 0 ... 3 ... is followed in both
    assert {(o.seq, o.pos, o.length) for o in found} == {(1, 2, 1), (0, 3, 2), (0, 6, 2)}
    assert all(o.length <= 1 for o in index.occurrences([4, 2, 3], max_depth=1))
    assert index.occurrences([4, 2, 8], max_depth=8) == []


def test_a_frequent_last_token_never_crowds_out_a_long_match():
    old = [1, 2, 3, 4, 99]  # the only place where the whole tail [1, 2, 3, 4] occurred
    index = index_of(old, *([[8, 4, 7]] * 100))  # a hundred newer answers end a 1-token match
    found = index.occurrences([1, 2, 3, 4], max_depth=8, limit=10)
    assert len(found) == 10 and found[0] == (0, 4, 4)
    draft = best_match(index, [1, 2, 3, 4], max_depth=8, budget=4, factor=1.0, min_prob=0.1, width=1)
    assert (draft.tokens, draft.match) == ((99,), 4)


def test_continuations_count_what_followed_and_multiply_along_the_path():
    # After [2, 3]: 5 followed three times (then 6, 6, 7), 9 once.
    seqs = index_of([2, 3, 5, 6], [2, 3, 5, 6], [2, 3, 5, 7], [2, 3, 9]).seqs
    found = [Occurrence(s, 2, 2) for s in range(4)]
    tree = continuations(seqs, found, budget=8, min_prob=0.0, width=4)
    assert (tree.followed, tree.seen) == (3, 4)
    nodes = {(tok, tree.parents[i]): p for i, (tok, p) in enumerate(zip(tree.tokens, tree.probs))}
    assert nodes[(5, -1)] == pytest.approx(0.75) and nodes[(9, -1)] == pytest.approx(0.25)
    five = tree.tokens.index(5)
    assert nodes[(6, five)] == pytest.approx(0.75 * 2 / 3) and nodes[(7, five)] == pytest.approx(0.25)
    assert tree.score == pytest.approx(sum(tree.probs))
    # best first: parents come before children, probabilities never rise
    assert all(p < i for i, p in enumerate(tree.parents)) and list(tree.probs) == sorted(tree.probs, reverse=True)
    path = continuations(seqs, found, budget=8, min_prob=0.0, width=1)
    assert path.tokens == (5, 6) and path.parents == (-1, 0)
    sure = continuations(seqs, found, budget=8, min_prob=0.3, width=4)
    assert sure.tokens == (5, 6)  # 0.25-likely nodes are not drafted
    assert continuations(seqs, found, budget=1, min_prob=0.0, width=4).tokens == (5,)


def test_the_draft_size_follows_the_match_length():
    """At most factor * m tokens after an m-token match (the paper's max_spec_factor)."""
    index = index_of([1, 2, 3, 4, 5, 6, 7, 8, 9])
    one = best_match(index, [0, 0, 3], max_depth=8, budget=8, factor=1.0, min_prob=0.1, width=1)
    three = best_match(index, [1, 2, 3], max_depth=8, budget=8, factor=1.0, min_prob=0.1, width=1)
    assert (one.match, one.tokens) == (1, (4,))
    assert (three.match, three.tokens) == (3, (4, 5, 6))
    double = best_match(index, [1, 2, 3], max_depth=8, budget=4, factor=2.0, min_prob=0.1, width=1)
    assert double.tokens == (4, 5, 6, 7)  # the budget caps it


def test_memory_evicts_the_oldest_answers_past_its_cap():
    memory = SuffixMemory(max_tokens=10)
    memory.add([1, 2, 3, 4])
    memory.add([5, 6, 7, 8])
    memory.add([9, 10, 11])
    assert memory.sequences == [[5, 6, 7, 8], [9, 10, 11]] and len(memory) == 7
    memory.add(list(range(20, 40)))  # longer than the cap: its last 10 tokens
    assert memory.sequences == [list(range(30, 40))]
    with pytest.raises(SpecvizError):
        SuffixMemory(max_tokens=0)


def test_memory_saves_and_loads(tmp_path):
    memory = SuffixMemory(max_tokens=100)
    memory.add([1, 2, 3])
    memory.add([4, 5])
    memory.save(tmp_path / "m.json")
    back = SuffixMemory.load(tmp_path / "m.json")
    assert back.sequences == [[1, 2, 3], [4, 5]] and back.max_tokens == 100
    assert [(o.seq, o.pos) for o in back.index.occurrences([2], 4)] == [(0, 2)]


@pytest.mark.parametrize("content", [
    "not json", "[1, 2]", json.dumps({"format": "other", "sequences": []}),
    json.dumps({"format": "specviz-suffix-memory", "max_tokens": 10, "sequences": [[1, -2]]}),
    json.dumps({"format": "specviz-suffix-memory", "max_tokens": 10, "sequences": [[1, True]]}),
    json.dumps({"format": "specviz-suffix-memory", "max_tokens": 10, "sequences": [["a"]]}),
    json.dumps({"format": "specviz-suffix-memory", "max_tokens": 0, "sequences": []}),
    json.dumps({"format": "specviz-suffix-memory", "max_tokens": 10, "sequences": {"a": 1}}),
])
def test_a_hostile_memory_file_gets_a_sentence(tmp_path, content):
    path = tmp_path / "m.json"
    path.write_text(content)
    with pytest.raises(SpecvizError, match="suffix memory"):
        SuffixMemory.load(path)
    with pytest.raises(SpecvizError, match="cannot read"):
        SuffixMemory.load(tmp_path / "missing.json")


def test_a_memory_from_another_tokenizer_is_refused(target):
    memory = SuffixMemory()
    memory.add([1, 2, 500])  # the tiny target's vocabulary is 96
    with pytest.raises(SpecvizError, match="another tokenizer"):
        collect(speculative_generate(target, Suffix(memory), REPEATS, GenerationConfig(max_new_tokens=4)))


# -- exactness ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def baseline(target):
    return collect(baseline_generate(target, REPEATS, GenerationConfig(max_new_tokens=30)))[1]


@pytest.mark.parametrize("tree_width", [4, 0])
@pytest.mark.parametrize("k,dynamic", [(1, False), (3, False), (8, False), (2, True)])
def test_greedy_output_is_the_baseline_cold_and_warm(target, baseline, tree_width, k, dynamic):
    memory, trees = SuffixMemory(), []
    cfg = GenerationConfig(max_new_tokens=30, k=k, dynamic_k=dynamic, draft_confidence=0.2 if dynamic else 0.0)
    for _ in range(2):  # the second run drafts from the first one's answer
        drafter = Suffix(memory)
        drafter.tree_width = tree_width
        steps, end = collect(speculative_generate(target, drafter, REPEATS, cfg))
        assert end.token_ids == baseline.token_ids
        assert any(s.draft for s in steps)
        trees += [s.tree for s in steps if s.tree is not None]
    assert bool(trees) == (tree_width > 1)  # "5 6 7" was followed by 8 and by 30: a branch (2k nodes, even at k = 1)


def test_an_earlier_answer_makes_the_next_request_cheaper(target):
    """Request 2 (the same question, then one with its first token changed) keeps more drafted
    tokens per step with request 1's answer in memory than without it."""
    cfg = GenerationConfig(max_new_tokens=30, k=6)
    again, variant = list(REPEATS), [77] + REPEATS[1:]

    def run(memory, prompt):
        return collect(speculative_generate(target, Suffix(memory), prompt, cfg))[1].stats

    for prompt in (again, variant):
        cold = run(SuffixMemory(), prompt)
        memory = SuffixMemory()
        run(memory, REPEATS)
        warm = run(memory, prompt)
        assert warm.accepted > cold.accepted and warm.steps < cold.steps


def test_warm_ups_and_unremembered_runs_leave_the_memory_alone(target):
    memory = SuffixMemory()
    warm_up(target, Suffix(memory), REPEATS, GenerationConfig(max_new_tokens=8))
    collect(speculative_generate(target, Suffix(memory), REPEATS, GenerationConfig(max_new_tokens=8), remember=False))
    assert len(memory) == 0
    collect(speculative_generate(target, Suffix(memory), REPEATS, GenerationConfig(max_new_tokens=8)))
    assert memory.sequences[0][-8:] == memory.sequences[0][len(REPEATS):] and len(memory) == len(REPEATS) + 8


def test_each_step_says_where_its_draft_came_from(target):
    memory = SuffixMemory()
    cfg = GenerationConfig(max_new_tokens=20, k=4)
    first, _ = collect(speculative_generate(target, Suffix(memory), REPEATS, cfg))
    assert first[0].source == "suffix tree, 3-token match: followed 1 of 2 times in the prompt"
    second, _ = collect(speculative_generate(target, Suffix(memory), REPEATS, cfg))
    assert any(s.source.endswith("of 1 time in earlier requests") for s in second)


@pytest.mark.slow  # a thousand sampled runs for a chi-square test
def test_sampled_tokens_follow_the_target_while_the_memory_grows():
    """Chi-square of the first three sampled tokens against the exact joint. The memory keeps
    the last hundred runs' answers (its cap drops older ones as it fills), so later runs draft
    chains drawn from the frequencies of earlier samples (q is not one-hot); every other run
    pairs suffix decoding with a draft model (suffix+NAME), so the one test covers both (the
    joint is the target's either way). The cap also bounds the test's time: with a four-token
    vocabulary every remembered token is a match, so a whole thousand answers made it 18 s."""
    model = tiny_llama(vocab=4, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)
    joint, other = exact_joint(model, SAMPLING), noisy_copy(model, 0.5, seed=11)
    memory, counts, spread, paired = SuffixMemory(max_tokens=300), {}, False, set()
    for seed in range(N):
        drafter = Suffix(memory) if seed % 2 else Hybrid(DraftModel(other), Suffix(memory))
        cfg = GenerationConfig(max_new_tokens=3, k=3, sampling=Sampling(**{**SAMPLING.__dict__, "seed": seed}))
        steps, end = collect(speculative_generate(model, drafter, PROMPT, cfg))
        counts[end.token_ids] = counts.get(end.token_ids, 0) + 1
        spread |= any(s.q and 0 < min(s.q) < 1 for s in steps)
        paired |= {s.source.split(" ")[0] for s in steps if s.draft and not seed % 2}
    assert spread  # some drafts were drawn from a spread of remembered continuations
    assert paired == {"draft", "suffix"}, paired  # both halves of the pair drafted
    assert_matches(counts, joint)


# -- suffix+NAME and the specs ------------------------------------------------------------

def test_the_model_drafts_where_the_suffix_match_is_unsure(target, baseline):
    memory, cfg = SuffixMemory(), GenerationConfig(max_new_tokens=30, k=4)
    for run in range(2):
        hybrid = Hybrid(LayerSkip(target, [0]), Suffix(memory))
        steps, end = collect(speculative_generate(target, hybrid, REPEATS, cfg))
        assert end.token_ids == baseline.token_ids
        sources = {s.source.split(" ")[0] for s in steps if s.draft}
        # cold: each where it is sure; warm: the whole answer is in memory, sure everywhere
        assert sources == ({"layer", "suffix"} if run == 0 else {"suffix"})


def test_plan_copies_only_when_the_expected_length_is_high(target):
    hybrid = Hybrid(LayerSkip(target, [0]), Suffix())
    hybrid.begin([1, 2, 3, 4, 5, 6], None, None, "cpu")
    assert hybrid.plan([1, 2, 3, 4, 5, 6]) == MODEL and not hybrid.copying
    assert hybrid.plan([1, 2, 3, 4, 5, 6, 1, 2, 3]) == 103 and hybrid.copying  # 3 sure tokens
    assert hybrid.plan([1, 2, 3, 4, 5, 6, 1, 2, 3, 9, 1]) == MODEL  # a 1-token match: 1 token


def test_specs_name_suffix_decoding(target):
    loaded = SimpleNamespace(model=target, name="tiny")
    memory = SuffixMemory()
    assert make_drafter("suffix", loaded, memory=memory).memory is memory
    assert make_drafter("suffix", loaded).memory is process_memory()
    hybrid = make_drafter("suffix+layerskip:0", loaded, memory=memory)
    assert isinstance(hybrid, Hybrid) and isinstance(hybrid.copier, Suffix) and hybrid.copier.memory is memory
    assert parse("suffix").label == "suffix decoding" and parse("suffix+eagle").label == "suffix decoding + EAGLE"
    assert not parse("suffix").needs_model and parse("suffix+some/draft-model").needs_model
    for bad in ("suffix+pld", "suffix+suffix", "suffix+none", "suffix+layerskip+pld"):
        with pytest.raises(SpecvizError, match="pairs"):
            make_drafter(bad, loaded)

