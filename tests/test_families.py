"""Every model a user brings: tiny random models of the popular decoder families, in three precisions,
with every drafter that applies (the matrix, specviz/matrix/cells.py), against plain decoding.

Sliding-window and mixed caches must roll back past their window; whatever the family applies after
its LM head (soft-capping, logit scales) must reach the verifier; a drafter a family cannot have is
refused in one sentence before the run.
"""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

from specviz import DraftModel, GenerationConfig, PromptLookup, Sampling, baseline_generate, collect, speculative_generate
from specviz.matrix import cells as matrix
from specviz.core.errors import SpecvizError
from specviz.matrix.families import FAMILIES, SLIDING, WINDOW, tiny_model
from specviz.drafters.eagle import Eagle, EagleHead, eagle_config
from specviz.modeling.forward import RollbackCache, forward, new_cache, rollback
from test_sampling_distribution import assert_matches

RESULTS = pathlib.Path(__file__).parents[1] / "assets" / "models" / "matrix-cpu.json"
REQUIRED = {"llama", "llama-rope-scaling", "qwen2", "qwen3", "qwen3-moe", "phi3", "olmo2", "granite", "gpt2",
            "gpt-neox", "falcon", "opt", "mistral", "mixtral", "gemma2", "gemma3", "cohere2", "gpt-oss",
            # GPT-style stacks and Llama 4's text model (issue 57)
            "bloom", "gpt-j", "gpt-neo", "codegen", "gpt-bigcode", "mpt", "dbrx", "llama4-text"}
NO_COPYING = {"gpt-bigcode"}  # its tiny model's greedy text repeats nothing of the prompt: nothing to look up


def test_the_matrix_covers_the_families_the_issue_names():
    assert REQUIRED <= set(FAMILIES)
    assert {"mistral", "gemma2", "gemma3", "cohere2", "gpt-oss"} <= set(SLIDING)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_drafter_matches_plain_decoding_in_every_precision(family):
    cells = matrix.run_family(family)
    assert {(c.dtype, c.drafter) for c in cells} == {(d, n) for d in matrix.DTYPES for n in matrix.DRAFTERS}
    for c in cells:
        where = f"{c.family} {c.dtype} {c.drafter}: {c.detail}"
        assert c.outcome != "refused", where  # every family has every drafter, layer skip included
        if c.dtype == "fp32":
            assert c.outcome == "identical", where
        else:  # half precision: identical, or parted at a tie the precision's rounding explains
            assert c.outcome in ("identical", "near-tie"), where
    # The accept paths ran too: trained heads and copying drafters had drafts kept.
    kept = {c.drafter for c in cells if c.accepted}
    assert ({"eagle", "medusa"} if family in NO_COPYING else {"pld", "eagle", "medusa"}) <= kept, kept
    committed = {(c["dtype"], c["drafter"]): c["outcome"] for c in json.loads(RESULTS.read_text())["cells"]
                 if c["family"] == family}
    for c in cells:  # the docs' table says what this machine sees (a near-tie may land elsewhere)
        same = {"identical", "near-tie"}
        assert (committed[c.dtype, c.drafter] in same) == (c.outcome in same), (c, committed[c.dtype, c.drafter])


@pytest.mark.parametrize("family", ["mistral", "gemma3", "gpt-oss"])
def test_sliding_layers_roll_back_yet_hold_no_more_than_their_window(family):
    model = tiny_model(family)
    cache = new_cache(model)
    assert isinstance(cache, RollbackCache)
    ids = matrix.prompt()
    forward(model, torch.tensor(ids[:30]), cache, logits_to_keep=1)  # prefill past the window
    sliding = [layer for layer in cache.layers if layer.is_sliding]
    assert sliding and all(layer.keys.shape[-2] == WINDOW - 1 for layer in sliding)  # the prefill kept no more
    for start in (30, 32, 34):  # drafts verified then partly rejected, as the engine does
        before = forward(model, torch.tensor(ids[start:start + 6]), cache)
        rollback(cache, start + 2)
        assert cache.get_seq_length() == start + 2
        assert all(layer.keys.shape[-2] == WINDOW - 1 for layer in sliding)
        again = forward(model, torch.tensor(ids[start + 2:start + 6]), cache)
        torch.testing.assert_close(again, before[2:])  # the rolled-back cache reads as if never extended
        rollback(cache, start + 2)
    with pytest.raises(SpecvizError, match="cannot roll a sliding-window cache back"):
        rollback(cache, 30)  # behind the last rollback: those states left the window


@pytest.mark.parametrize("family", ["gemma2", "cohere2", "granite"])
def test_feature_drafters_get_the_logits_the_family_applies_after_its_head(family):
    """Gemma soft-caps its logits, Cohere scales them, Granite divides them: the target's logits
    read beside its features must be the model's own, or sampling would follow another distribution."""
    model = tiny_model(family)
    ids = torch.tensor(matrix.prompt()[:24])
    with torch.inference_mode():
        want = model(input_ids=ids[None]).logits[0].float()
        logits, h = forward(model, ids, new_cache(model), hidden=True)
    torch.testing.assert_close(logits, want)
    assert h.shape == (24, model.config.hidden_size)


V, PROMPT = 6, [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1]  # 20 tokens: past a window of 16
SAMPLING = Sampling(temperature=1.2, top_k=5)
RUNS = 500  # enough for 36 cells pooled to expected counts of 5; a wrong rule misses by far more


def _soft(family):
    model = tiny_model(family, vocab=V, seed=3)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(0.05)  # back from tiny_model's sharpening: every pair has mass
    return model


def _joint(model) -> dict:
    """The target's exact law of its first two sampled tokens, by enumeration."""
    from specviz.core.sampling import Processor

    out = {}
    with torch.inference_mode():
        for a in range(V):
            for b in range(V):
                prob = 1.0
                for ctx, t in ((PROMPT, a), (PROMPT + [a], b)):
                    logits = model(input_ids=torch.tensor([ctx])).logits[0, -1:]
                    prob *= Processor(SAMPLING, V, ctx, "cpu").probs(logits)[0, t].item()
                out[(a, b)] = prob
    return out


@pytest.mark.slow  # hundreds of sampled runs for a chi-square test
@pytest.mark.parametrize("family,drafter", [("gemma2", "eagle"), ("mistral", "draft-model")])
def test_sampled_tokens_of_sliding_families_follow_the_target(family, drafter):
    """Past the window, with the family's own logit processing: the first two sampled tokens
    have the target's joint law (chi-square over RUNS seeded runs; a random head or draft model
    proposes with its own q, which the rule must undo)."""
    model = _soft(family)
    if drafter == "eagle":
        torch.manual_seed(0)
        head = EagleHead(eagle_config(model), None).requires_grad_(False)
        make = lambda: Eagle(model, head, tree_width=0)  # noqa: E731
    else:
        other = tiny_model("llama", vocab=V, seed=4)
        make = lambda: DraftModel(other)  # noqa: E731
    counts = {}
    for seed in range(RUNS):
        cfg = GenerationConfig(max_new_tokens=2, k=2, sampling=Sampling(**{**SAMPLING.__dict__, "seed": seed}))
        key = tuple(collect(speculative_generate(model, make(), PROMPT, cfg))[1].token_ids)
        counts[key] = counts.get(key, 0) + 1
    assert_matches(counts, _joint(model))


def test_plain_decoding_of_a_sliding_family_is_transformers_own():
    """The baseline every cell compares with is the model's own greedy decoding, past the window."""
    model = tiny_model("gemma3")
    ids = matrix.prompt()
    _, end = collect(baseline_generate(model, ids, GenerationConfig(max_new_tokens=12, eos_token_ids=(1,))))
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=1, pad_token_id=1)
    assert list(end.token_ids) == out[0, len(ids):].tolist()


def test_every_family_says_how_many_positions_it_has():
    """The engine stops at the model's context: a family whose limit it cannot read runs past it, and
    MPT (`max_seq_len`) then failed inside its attention with a size mismatch. The tiny builder gives
    each family 512 positions under the family's own name for them; BLOOM has no limit (ALiBi)."""
    from types import SimpleNamespace

    from specviz.matrix.families import tiny_config
    from specviz.modeling.forward import context_length

    for family in FAMILIES:
        config = tiny_config(family)
        named = {k for k, v in config.to_dict().items() if v == 512}
        assert bool(named) == (context_length(SimpleNamespace(config=config)) == 512), (family, named)


def test_a_run_that_fills_mpts_context_ends_there_instead_of_failing():
    model = tiny_model("mpt")
    model.config.max_seq_len = 48
    ids = matrix.prompt()  # 40 tokens that repeat, so prompt lookup drafts up to the last position
    _, end = collect(speculative_generate(model, PromptLookup(), ids, GenerationConfig(max_new_tokens=40, k=4)))
    assert end.stats.stop_reason == "context" and len(ids) + len(end.token_ids) == 48


def _rounding_at_ties(noise: float):
    """A float16 Mistral whose every choice is a tie (pairs of identical LM-head rows) and whose
    multi-row passes round the odd token of each pair `noise` higher: what a batched verify does
    to a near-tie on a GPU, at a size this CPU's fp16 (which rounds one row and five alike) shows."""
    model = tiny_model("mistral", dtype=torch.float16)
    with torch.no_grad():
        w = model.get_output_embeddings().weight
        w[1::2] = w[0::2]
    odd = (torch.arange(w.shape[0]) % 2).to(torch.float16)
    model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: out + noise * odd if out.shape[1] > 1 else out)
    return model


@pytest.mark.parametrize("noise,tie", [(0.02, True), (2.0, False)])
def test_a_greedy_run_that_parts_says_where_and_whether_rounding_explains_it(noise, tie):
    from specviz.cli.terminal import print_summary
    from specviz.core.divergence import first_divergence, tie_tolerance
    from specviz.render.numbers import agreement_html
    from specviz.render.trace import Trace

    model = _rounding_at_ties(noise)
    ids, cfg = matrix.prompt(), GenerationConfig(max_new_tokens=16, k=4)
    base_events, base = collect(baseline_generate(model, ids, cfg))
    steps, spec = collect(speculative_generate(model, PromptLookup(), ids, cfg))
    d = first_divergence(steps, base_events, tie_tolerance("float16"))
    assert d is not None and d.spec_token == d.base_token + 1  # the odd twin, chosen in the batched pass
    assert d.base_margin == 0.0  # the baseline's one-row passes see each pair exactly tied
    if tie:  # fp16 keeps ~3 decimals of a logit: the added margin survives to within its rounding
        assert d.spec_margin == pytest.approx(noise, abs=0.01)
    else:  # the even twin fell out of the verify row's top tokens, or trails by far more than rounding
        assert d.spec_margin is None or d.spec_margin > d.tolerance
    assert d.near_tie is tie
    assert ("not an acceptance error" in d.sentence()) is tie and ("bug" in d.sentence()) is not tie
    # The page says the same beside the panels ...
    spec_trace, base_trace = Trace("pld"), Trace("baseline", speculative=False)
    for e in steps:
        spec_trace.add(e)
    for e in base_events:
        base_trace.add(e)
    html = agreement_html(spec_trace, base_trace, greedy=True, dtype="torch.float16")
    assert f'data-near-tie="{str(tie).lower()}"' in html and f"token {d.position}" in html
    # ... and so does the command line's summary.
    import io

    out = io.StringIO()
    result = {"drafter": "pld", "label": "prompt lookup", "stats": spec.stats.to_dict(), "speedup": 1.0, "identical_to_baseline": False,
              "baseline": {"stats": base.stats.to_dict(), "tokens_per_s": 1.0},
              "divergence": {**d.to_dict(), "sentence": d.sentence()}}
    print_summary(result, out)
    assert d.sentence() in out.getvalue()


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    """Each family saved as a local folder with a real (tiny) tokenizer, made on first use."""
    from tiny_folder import make_family_dir

    root, made = tmp_path_factory.mktemp("families"), {}

    def folder(family: str) -> str:
        if family not in made:
            made[family] = str(make_family_dir(root / family, family))
        return made[family]
    return folder


@pytest.mark.parametrize("family", FAMILIES)
def test_the_app_loads_each_family_from_a_folder_and_runs_it(family, family_dirs):
    """What a user who brings their own model does: type its folder into the app and press Generate."""
    from app_server import PROMPT
    from specviz.modeling import models
    from specviz.ui import Policy, Settings
    from specviz.ui.live import runner
    from specviz.ui.views import playground_summary

    s = Settings(prompt=PROMPT, target=family_dirs(family), drafter="prompt lookup", max_new_tokens=8)
    *_, frame = runner.playground(s, Policy(), models, lambda: False)
    summary = playground_summary(frame)
    assert frame.state == "done", frame.message
    assert summary["identical"] is True and len(frame.spec.token_ids) == len(frame.base.token_ids) > 0


@pytest.mark.parametrize("kind", ["recurrent", "look-ahead"])
def test_a_model_the_engine_cannot_verify_is_refused_on_the_page_and_the_command_line(kind, tmp_path, capsys):
    """Mamba's state cannot return to an earlier token; an ELECTRA-style model attends to tokens
    after each one. Both are refused before any run: one sentence, on the page and on stderr."""
    import transformers
    from tiny_folder import _make_tokenizer, WORDS

    from specviz.cli.main import main as cli_main
    from specviz.modeling import models
    from specviz.ui import Policy, Settings
    from specviz.ui.live import runner

    tokenizer = _make_tokenizer(list(WORDS), "bytelevel")
    v = len(tokenizer)
    if kind == "recurrent":
        config, why = transformers.MambaConfig(vocab_size=v, hidden_size=32, num_hidden_layers=2), "rolled back"
    else:
        config = transformers.ElectraConfig(vocab_size=v, hidden_size=32, embedding_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, intermediate_size=64)
        why = "looks ahead"
    folder = tmp_path / kind
    torch.manual_seed(0)  # the probe must see the look-ahead in any random model; seeded so a failure repeats
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    *_, frame = runner.playground(Settings(prompt="the cat sat", target=str(folder)), Policy(), models, lambda: False)
    assert frame.state == "error" and "cannot be used for speculative decoding" in frame.message
    assert why in frame.message and "\n" not in frame.message and "Traceback" not in frame.message
    assert cli_main(["generate", "--prompt", "the cat sat", "--target", str(folder)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and why in errors[0], errors
