"""The whole loop on tiny random models: greedy speculative output is the greedy baseline,
token for token, for every drafter; caches stay right after rejections; runs stop cleanly."""
from __future__ import annotations

import math
import re

import pytest
from app_server import app_models  # noqa: F401 (a fixture)
import torch

from conftest import noisy_copy, tiny_llama
from specviz import DraftModel, GenerationConfig, LayerSkip, PromptLookup, Sampling, SpecvizError, collect
from specviz import baseline_generate, speculative_generate
from specviz.modeling.forward import forward, new_cache, rollback


@pytest.fixture(scope="module")
def drafters(target):
    return {
        "none": lambda: None,
        "pld": lambda: PromptLookup(),
        "draft-close": lambda: DraftModel(noisy_copy(target, 0.05)),
        "draft-far": lambda: DraftModel(tiny_llama(seed=7)),
        "draft-self": lambda: DraftModel(target),
        "layer-skip": lambda: LayerSkip(target, [0]),
    }


def hf_greedy(model, prompt, n, **kw):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_baseline_greedy_is_transformers_greedy(target, prompts, penalty):
    cfg = GenerationConfig(max_new_tokens=30, sampling=Sampling(repetition_penalty=penalty))
    for prompt in prompts:
        _, end = collect(baseline_generate(target, prompt, cfg))
        assert list(end.token_ids) == hf_greedy(target, prompt, 30, repetition_penalty=penalty)


@pytest.mark.parametrize("name", ["none", "pld", "draft-close", "draft-far", "draft-self", "layer-skip"])
@pytest.mark.parametrize("k,dynamic", [(1, False), (3, False), (8, False), (2, True)])
def test_greedy_speculative_equals_greedy_baseline(target, prompts, drafters, name, k, dynamic):
    cfg = GenerationConfig(max_new_tokens=40, k=k, dynamic_k=dynamic, draft_confidence=0.2 if dynamic else 0.0)
    for prompt in prompts:
        _, base = collect(baseline_generate(target, prompt, cfg))
        steps, end = collect(speculative_generate(target, drafters[name](), prompt, cfg))
        assert end.token_ids == base.token_ids
        assert sum(len(s.emitted) for s in steps) == end.stats.tokens == 40
        assert end.stats.target_calls == end.stats.steps + (len(prompt) > 1)
        assert end.stats.drafted == sum(len(s.draft) for s in steps)
        assert end.stats.accepted == sum(s.accepted for s in steps)


def test_greedy_with_repetition_penalty_matches_too(target, prompts):
    cfg = GenerationConfig(max_new_tokens=30, k=4, sampling=Sampling(repetition_penalty=1.5))
    for prompt in prompts:
        _, base = collect(baseline_generate(target, prompt, cfg))
        for drafter in (PromptLookup(), DraftModel(noisy_copy(target, 0.05))):
            _, end = collect(speculative_generate(target, drafter, prompt, cfg))
            assert end.token_ids == base.token_ids


def test_self_drafting_accepts_everything_and_saves_target_calls(target, prompts):
    steps, end = collect(speculative_generate(target, DraftModel(target), prompts[2], GenerationConfig(k=4, max_new_tokens=40)))
    assert end.stats.acceptance_rate == 1.0
    assert all(s.token_kind == "bonus" for s in steps)
    assert end.stats.steps == 8 and end.stats.mean_accepted_length == 5.0


def test_events_describe_each_step(target, prompts):
    steps, _ = collect(speculative_generate(target, DraftModel(noisy_copy(target, 0.05)), prompts[3], GenerationConfig(k=4, max_new_tokens=40)))
    assert any(s.token_kind == "corrected" for s in steps) and any(s.token_kind == "bonus" for s in steps)
    for s in steps:
        assert s.emitted == s.draft[: s.accepted] + (s.token,)
        assert s.token_kind == ("bonus" if s.accepted == len(s.draft) else "corrected")
        assert len(s.p) == len(s.accept_prob) == len(s.draft)
        assert s.q is not None and len(s.q) == len(s.draft) or not s.draft  # a draft model has q
        # Greedy: a draft token is accepted (1.0) exactly when it is the target's argmax.
        assert set(s.accept_prob) <= {0.0, 1.0}
        assert s.accept_prob[: s.accepted] == (1.0,) * s.accepted
        if s.accepted < len(s.draft):
            assert s.accept_prob[s.accepted] == 0.0
        assert s.top[0][0] == s.token  # greedy: the chosen token is the target's top-1
        assert s.draws is None and s.greedy


def test_rolled_back_cache_gives_the_logits_of_a_fresh_forward(target):
    ids = torch.arange(3, 20)
    cache = new_cache(target)
    with torch.inference_mode():
        forward(target, ids[:10], cache)
        forward(target, ids[10:16], cache)  # a draft of 6, of which 2 are kept
        rollback(cache, 12)
        after = forward(target, ids[12:14], cache)
        fresh = forward(target, ids[:14], new_cache(target))[-2:]
    assert torch.allclose(after, fresh, atol=1e-5)


def test_draft_model_cache_follows_the_accepted_prefix(target):
    from specviz.core.sampling import Processor

    drafter_model = noisy_copy(target, 0.05)
    ids = list(range(5, 25))
    proc = Processor(Sampling(), 96, ids, "cpu")
    drafter = DraftModel(drafter_model)
    with torch.inference_mode():
        drafter.begin(ids, proc, torch.Generator(), torch.device("cpu"))
        draft = drafter.propose(ids, 5).tokens.tolist()
        drafter.feedback(2)
        ids = ids + draft[:2] + [(draft[2] + 1) % 96]  # two kept, then a correction
        again = drafter.propose(ids, 3).tokens.tolist()
        fresh = DraftModel(drafter_model)
        fresh.begin(ids, proc, torch.Generator(), torch.device("cpu"))
        assert again == fresh.propose(ids, 3).tokens.tolist()


def test_stops_at_eos_and_keeps_it(target, prompts):
    cfg = GenerationConfig(max_new_tokens=40, k=4)
    _, base = collect(baseline_generate(target, prompts[1], cfg))
    eos = base.token_ids[12]
    first = base.token_ids.index(eos)
    cfg = GenerationConfig(max_new_tokens=40, k=4, eos_token_ids=(eos,))
    for drafter in (None, PromptLookup(), DraftModel(target)):
        _, end = collect(speculative_generate(target, drafter, prompts[1], cfg))
        assert end.token_ids == base.token_ids[: first + 1]
        assert end.stats.stop_reason == "eos"


@pytest.mark.parametrize("max_new", [1, 2, 7])
def test_max_new_tokens_is_exact_even_with_long_drafts(target, prompts, max_new):
    cfg = GenerationConfig(max_new_tokens=max_new, k=16)
    _, end = collect(speculative_generate(target, DraftModel(target), prompts[2], cfg))
    assert len(end.token_ids) == max_new and end.stats.stop_reason == "max_new_tokens"


def test_context_limit_ends_the_run(prompts):
    small = tiny_llama(context=48)
    _, end = collect(speculative_generate(small, DraftModel(small), prompts[3], GenerationConfig(max_new_tokens=40, k=8)))
    assert len(prompts[3]) + len(end.token_ids) == 48 and end.stats.stop_reason == "context"


def test_cancel_stops_after_the_current_step(target, prompts):
    seen = []
    events = speculative_generate(target, PromptLookup(), prompts[1], GenerationConfig(max_new_tokens=100),
                                  should_stop=lambda: len(seen) >= 3)
    for ev in events:
        seen.append(ev)
    assert seen[-1].stats.stop_reason == "cancelled" and len(seen) == 4


@pytest.mark.parametrize("drafter", ["pld", "eagle", "medusa"])
def test_a_long_prompt_is_read_in_chunks_with_the_same_output_and_its_progress_told(target, prompts, monkeypatch,
                                                                                     drafter):
    """The prefill reads PREFILL_CHUNK tokens a forward (7 here, on a 40-token prompt): the
    output is the one-pass prefill's, token for token, for chain and tree drafters that read
    the prompt's states (their drafts too: the states are the one pass's), and the reader hears
    each chunk."""
    import specviz.engine.generate as generate
    from test_heads import make

    def run(chunk: int):
        monkeypatch.setattr(generate, "PREFILL_CHUNK", chunk)
        told = {"spec": [], "base": []}
        cfg = GenerationConfig(max_new_tokens=20, k=3)
        spec = PromptLookup() if drafter == "pld" else make(drafter, target)
        steps, end = collect(speculative_generate(target, spec, prompts[3], cfg,
                                                  on_prefill=lambda *a: told["spec"].append(a)))
        _, base = collect(baseline_generate(target, prompts[3], cfg, on_prefill=lambda *a: told["base"].append(a)))
        assert end.token_ids == base.token_ids
        return (end.token_ids, [s.draft for s in steps]), told

    whole, told_once = run(10_000)
    chunked, told = run(7)
    assert chunked == whole
    assert told_once["spec"] == [(39, 39)]  # all but the last prompt token: it rides with the first step
    assert told["spec"] == told["base"] == [(n, 39) for n in (7, 14, 21, 28, 35, 39)]


@pytest.mark.parametrize("family", ["gpt2", "qwen3-moe", "mistral"])
def test_chunked_prefill_on_transformers_caches_too(monkeypatch, family):
    """Families the fast path does not take (transformers' own cache: chunks too) and a sliding
    one (its RollbackCache takes the prefill whole): the same tokens and drafts either way."""
    import specviz.engine.generate as generate
    from specviz.matrix import cells as matrix
    from specviz.matrix.families import tiny_model

    model, ids = tiny_model(family, matrix.VOCAB), matrix.prompt()

    def run(chunk: int):
        monkeypatch.setattr(generate, "PREFILL_CHUNK", chunk)
        told = []
        steps, end = collect(speculative_generate(model, DraftModel(model), ids, GenerationConfig(max_new_tokens=12, k=3),
                                                  on_prefill=lambda *a: told.append(a)))
        return end.token_ids, [s.draft for s in steps], len(told)

    whole, chunked = run(10_000), run(9)
    assert chunked[:2] == whole[:2]
    assert chunked[2] == (1 if family == "mistral" else 5)  # 39 tokens: chunks of 9, or whole when sliding


def test_stop_during_a_long_prefill_ends_the_run_between_chunks(target, prompts, monkeypatch):
    import specviz.engine.generate as generate

    monkeypatch.setattr(generate, "PREFILL_CHUNK", 8)
    read = []
    events = list(speculative_generate(target, PromptLookup(), prompts[3], GenerationConfig(max_new_tokens=10),
                                       should_stop=lambda: len(read) >= 2, on_prefill=lambda n, _: read.append(n)))
    assert read == [8, 16] and len(events) == 1  # two chunks of five, then the run's end and nothing else
    assert events[0].stats.stop_reason == "cancelled" and events[0].token_ids == ()


class SlowCPU:
    """A fake clock and a forward that advances it as a busy 2-core CPU would: 50 ms a pass plus
    10 ms a token (512 tokens: 5.2 s, as the issue measured on the embedded model)."""

    def __init__(self, monkeypatch):
        import specviz.engine.generate as generate
        import specviz.engine.prefill as prefill

        self.now, real = 0.0, generate.forward

        def slow(model, ids, *args, **kwargs):
            self.now += 0.05 + 0.01 * len(ids)
            return real(model, ids, *args, **kwargs)
        monkeypatch.setattr(generate, "forward", slow)
        monkeypatch.setattr(prefill, "clock", lambda: self.now)


def test_prefill_pieces_are_sized_to_take_under_half_a_second(monkeypatch):
    """Each piece after the first takes 0.25-0.5 s of the slow CPU's time, growing by at most 4x
    a piece, never past the cap; a fast machine reads the cap at once."""
    from specviz.engine.prefill import PrefillPieces

    pieces, read, times = PrefillPieces(512), 0, []
    while read < 3082:
        size = min(pieces.next(), 3082 - read)
        times.append(0.05 + 0.01 * size)
        pieces.took(size, times[-1])
        read += size
    assert all(0.25 <= t <= 0.5 for t in times[1:-1]), times
    fast = PrefillPieces(512)
    for _ in range(4):
        fast.took(fast.next(), 1e-4)
    assert fast.next() == 512


def test_a_prompts_second_run_reads_it_in_the_first_runs_pieces(monkeypatch):
    """In bfloat16 a prompt cut elsewhere rounds otherwise (on the embedded model a baseline read in
    other pieces than its speculative run parted from it at the first token), so the race's second
    run reads the first's pieces even when the machine has slowed 3x meanwhile; another prompt is
    sized by its own time."""
    model = tiny_llama(context=2048)
    ids = torch.randint(0, 96, (1500,), generator=torch.Generator().manual_seed(6)).tolist()
    cfg = GenerationConfig(max_new_tokens=4, k=3)
    cpu = SlowCPU(monkeypatch)

    def pieces(run, prompt):
        read = []
        collect(run(prompt, on_prefill=lambda n, _: read.append(n)))
        return read
    spec = pieces(lambda p, **kw: speculative_generate(model, PromptLookup(), p, cfg, **kw), ids)
    import specviz.engine.generate as generate
    real = generate.forward
    monkeypatch.setattr(generate, "forward", lambda m, i, *a, **kw: (setattr(cpu, "now", cpu.now + 0.02 * len(i)),
                                                                      real(m, i, *a, **kw))[1])
    assert pieces(lambda p, **kw: baseline_generate(model, p, cfg, **kw), ids) == spec and len(spec) > 3
    other = [(ids[0] + 1) % 96] + ids[1:]
    assert pieces(lambda p, **kw: baseline_generate(model, p, cfg, **kw), other) != spec  # its own time


def test_stop_during_a_long_prefill_ends_the_run_within_a_second_of_a_slow_cpus_time(monkeypatch):
    """Stop pressed 1 s into reading a 1,500-token prompt: the run ends when the piece under way
    does, within 0.5 s (fixed 512-token pieces took 5.2 s here: Stop took 6.3 s on the real CPU),
    and the output of a run not stopped is the one-pass prefill's, token for token, drafts too."""
    model = tiny_llama(context=2048)
    ids = torch.randint(0, 96, (1500,), generator=torch.Generator().manual_seed(5)).tolist()
    cfg = GenerationConfig(max_new_tokens=8, k=3)
    cpu = SlowCPU(monkeypatch)
    pressed = []

    def should_stop():
        if cpu.now >= 1.0 and not pressed:
            pressed.append(cpu.now)
        return bool(pressed)
    events = list(speculative_generate(model, PromptLookup(), ids, cfg, should_stop=should_stop))
    assert events[-1].stats.stop_reason == "cancelled" and pressed
    assert cpu.now - 1.0 <= 0.5, cpu.now  # the piece under way when Stop came, and nothing after it

    steps, end = collect(speculative_generate(model, PromptLookup(), ids, cfg))
    import specviz.engine.generate as generate
    monkeypatch.setattr(generate, "PREFILL_CHUNK", 10_000)
    monkeypatch.setattr("specviz.engine.prefill.FIRST_PIECE", 10_000)
    once_steps, once = collect(speculative_generate(model, PromptLookup(), ids, cfg))
    assert end.token_ids == once.token_ids and [s.draft for s in steps] == [s.draft for s in once_steps]


def test_sampling_is_reproducible_per_seed(target, prompts):
    def run(seed):
        cfg = GenerationConfig(max_new_tokens=30, sampling=Sampling(temperature=1.0, top_p=0.95, seed=seed))
        return collect(speculative_generate(target, DraftModel(noisy_copy(target, 0.05)), prompts[2], cfg))[1].token_ids
    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(k=0), "k (draft length)"),
        (dict(k=10_000), "k (draft length)"),
        (dict(max_new_tokens=0), "max new tokens"),
        (dict(sampling=Sampling(temperature=-1.0)), "temperature"),
        (dict(sampling=Sampling(temperature=math.nan)), "temperature"),
        (dict(sampling=Sampling(temperature=1.0, top_p=0.0)), "top-p"),
        (dict(sampling=Sampling(temperature=1.0, top_p=1.5)), "top-p"),
        (dict(sampling=Sampling(temperature=1.0, top_k=-2)), "top-k"),
        (dict(sampling=Sampling(repetition_penalty=0.0)), "repetition penalty"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_message(target, change, message):
    with pytest.raises(SpecvizError, match=re.escape(message)):
        next(speculative_generate(target, None, [1, 2], GenerationConfig(**change)))


def test_bad_prompts_are_refused(target):
    with pytest.raises(SpecvizError, match="empty"):
        next(speculative_generate(target, None, [], GenerationConfig()))
    with pytest.raises(SpecvizError, match="context"):
        next(baseline_generate(target, list(range(90)) * 3, GenerationConfig()))
    with pytest.raises(SpecvizError, match="token ids"):
        next(baseline_generate(target, [5, 500], GenerationConfig()))


def test_prompt_lookup_drafts_long_after_long_matches_and_one_token_after_a_1gram():
    pld = PromptLookup()
    pld.begin([0], None, None, "cpu")
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 3]  # tail "3" matches once, as a 1-gram
    assert pld.propose(ids, 4).tokens.tolist() == [4]
    ids += [4, 5]  # tail "3 4 5" matches as a 3-gram
    assert pld.propose(ids, 4).tokens.tolist() == [6, 7, 8, 20]
    uncapped = PromptLookup(weak_match_tokens=0)
    uncapped.begin([0], None, None, "cpu")
    assert uncapped.propose(ids[:11], 4).tokens.tolist() == [4, 5, 6, 7]


def test_prompt_lookup_never_proposes_the_chat_templates_special_tokens(app_models):  # noqa: F811
    """The template's <|im_start|> follows a line break in every chat prompt; a draft stops
    before it, so a run does not open with a struck-through template token."""
    from specviz.run.spec import make_drafter
    from specviz.modeling import models

    target = models.load(app_models["target"])
    start = target.tokenizer.convert_tokens_to_ids("<|im_start|>")
    ids = models.encode_prompt(target, "Say hi.\nThen bye.")
    pld = make_drafter("pld", target)
    pld.begin(ids, None, None, "cpu")
    for tail in range(len(ids), 1, -1):  # whatever the context ends with, no special token comes back
        assert start not in pld.propose(ids[:tail], 8).tokens.tolist()
    plain = PromptLookup()
    plain.begin(ids, None, None, "cpu")
    assert any(start in plain.propose(ids[:tail], 8).tokens.tolist() for tail in range(2, len(ids) + 1))


def test_suffix_decoding_never_drafts_the_chat_templates_special_tokens(app_models):  # noqa: F811
    """Suffix decoding proposed <|im_start|> after a line break (the template writes one into every
    prompt and every remembered answer); alone or paired with a model drafter it now never does."""
    from specviz.drafters.suffix import Suffix
    from specviz.drafters.suffix_memory import SuffixMemory
    from specviz.modeling import models
    from specviz.run.spec import make_drafter

    target = models.load(app_models["target"])
    start = target.tokenizer.convert_tokens_to_ids("<|im_start|>")
    ids = models.encode_prompt(target, "Say hi.\nThen bye.\nSay hi.")

    def proposed(drafter) -> list[list[int]]:
        drafter.begin(ids, None, None, "cpu", trees=True)
        drafter.finish(ids[-5:])  # an answer remembered, template tokens and all
        drafter.begin(ids, None, None, "cpu", trees=True)
        return [drafter.propose(ids[:tail], 8).tokens.tolist() for tail in range(2, len(ids) + 1)]

    assert any(start in d for d in proposed(Suffix(SuffixMemory())))  # what the filter removes
    assert not any(start in d for d in proposed(make_drafter("suffix", target, memory=SuffixMemory())))
    pair = make_drafter(f"suffix+{app_models['draft']}", target, memory=SuffixMemory())
    assert start in pair.copier.special


def test_dropping_special_tokens_keeps_a_trees_other_branches_and_a_sampled_chains_q_a_distribution():
    from specviz.drafters.base import Draft, without_special

    # 9 is special: the tree loses it and its child; the chain stops before it
    tree = without_special(Draft(torch.tensor([1, 9, 2, 3, 4]), None, (-1, -1, 0, 1, 2)), frozenset({9}))
    assert tree.tokens.tolist() == [1, 2, 4] and tree.parents is None  # what is left is one branch
    q = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.2, 0.6], [0.1, 0.1, 0.8]])
    chain = without_special(Draft(torch.tensor([0, 1, 2]), q), frozenset({2}))
    assert chain.tokens.tolist() == [0, 1]
    assert torch.allclose(chain.q, torch.tensor([[2 / 3, 1 / 3, 0], [0.5, 0.5, 0]]))


def test_prompt_lookup_is_asked_for_the_length_its_kind_of_match_has_earned():
    """With dynamic k, prompt lookup names the n-gram length it matches before drafting
    (plan), and the engine asks for the length that kind of match has earned: the random
    target rejects the copied pattern, so 3-gram matches are soon asked for less than the
    first ones were; the output stays the baseline's."""
    target = tiny_llama()
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 6 + [5, 6, 7]
    asked = []

    class Spy(PromptLookup):
        def plan(self, ids):
            self.kind = super().plan(ids)
            return self.kind

        def propose(self, ids, k, min_confidence=0.0):
            asked.append((self.kind, k))
            return super().propose(ids, k, min_confidence)

    cfg = GenerationConfig(max_new_tokens=40, k=4, dynamic_k=True)
    steps, end = collect(speculative_generate(target, Spy(), prompt, cfg))
    _, ref = collect(baseline_generate(target, prompt, cfg))
    assert end.token_ids == ref.token_ids
    after_3grams = [k for kind, k in asked if kind == 3]
    assert after_3grams[0] == 4  # nothing measured yet: the k the user gave
    assert min(after_3grams[1:]) < max(after_3grams[:2])


def test_dynamic_k_is_not_locked_out_by_a_slow_rejected_first_step(target, prompts, monkeypatch):
    """Issue 38 through the whole loop, on a fake clock where verifying m tokens takes
    50 ms * (1 + 0.1 (m - 1)) and the first verify twice that: step 0's one-token draft is
    rejected, step 1 has nothing to draft, and from then on every draft would be kept. The
    old estimate held T(2) at its slow first time and never drafted again."""
    import specviz.engine.generate as engine
    from specviz.drafters.base import Draft, Drafter, empty_draft

    prompt = prompts[0]
    _, base = collect(baseline_generate(target, prompt, GenerationConfig(max_new_tokens=40)))
    truth = list(base.token_ids)
    now = [0.0]
    monkeypatch.setattr(engine.time, "perf_counter", lambda: now[0])

    def timed_verify(target, cache, n, pending, draft, *args, **kw):
        now[0] += 0.05 * (1 + 0.1 * draft.tokens.numel()) * (2 if now[0] == 0 else 1)
        return verify_chain(target, cache, n, pending, draft, *args, **kw)

    verify_chain = engine.verify_chain
    monkeypatch.setattr(engine, "verify_chain", timed_verify)

    class Scripted(Drafter):
        def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False):
            self.device, self.calls = device, 0

        def propose(self, ids, k, min_confidence=0.0):
            self.calls += 1
            done = len(ids) - len(prompt)
            if self.calls == 1:  # a wrong guess
                return Draft(torch.tensor([(truth[done] + 1) % 96], device=self.device), None)
            if self.calls == 2:  # no match
                return empty_draft(self.device)
            return Draft(torch.tensor(truth[done:done + k], device=self.device), None)

    steps, end = collect(speculative_generate(target, Scripted(), prompt, GenerationConfig(max_new_tokens=40, k=4, dynamic_k=True)))
    assert end.token_ids == base.token_ids
    assert [len(s.draft) for s in steps[:2]] == [1, 0]
    assert sum(len(s.draft) for s in steps[2:]) >= 20, [len(s.draft) for s in steps]
