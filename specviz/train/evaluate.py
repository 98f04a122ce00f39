"""Held-out measurements for a trained drafter's card: the same text seen two ways.

1. Teacher-forced: one pass over each held-out sequence gives, for every step the engine
   could take on that text (context x_<n, pending token x_{n-1}), the drafter's draft d as
   it would be once drafts 1..d-1 were kept: EAGLE on its own predicted features, Medusa
   from head d, the draft model from its own cache (recipe.drafts). Top-1 at depth d is how
   often that draft is the target's greedy token x_{n+d-1}.
2. Through the engine: greedy speculative decoding of the same prompts with chain drafts
   of length k: alpha, tau, and the acceptance at each depth among the steps that reached it.

At depth 1 both ask the same question about the same text, so wherever the engine has
written the stored text so far, its first draft must be the teacher-forced one at the same
context: a position, feature or subset mismatch between training and drafting shows up
there as a disagreement, and the card counts them. The two depth-1 rates then agree at the
steps the engine took. Over every position they need not: a step that keeps j drafts skips
the j positions after it, and kept drafts are the easy ones, so the engine's steps start
at hard positions more often than the text's positions do (by a lot on repetitive text).
"""
from __future__ import annotations

import time

import torch

from ..core import metrics as m
from .batches import crop
from .data import Corpus, Seq


def evaluate(recipe, module, target_loaded, held: Corpus, cfg, say) -> dict:
    """The card's "held-out" block: the held-out loss, then both measurements above."""
    if not held.sequences:
        if not cfg.held_out:
            return {"held-out": "none (no prompts held out)"}
        # The held-out prompts are chosen from the whole written pool, so a small data build may not
        # have answered any of them yet; the card must not read as if nothing was asked for.
        return {"held-out": f"none: the {cfg.held_out} prompts held out were not among those the data answered "
                            "(build more with --data-tokens or --data-minutes to measure on them)"}
    k, tokens = cfg.eval_k, cfg.eval_tokens
    losses = []
    for i in range(0, len(held.sequences), cfg.batch):
        chunk = [crop(s, 0, cfg.window) for s in held.sequences[i:i + cfg.batch]]
        losses.append(recipe.loss(module, target_loaded, chunk)[0].item() * len(chunk))
    loss = sum(losses) / len(held.sequences)
    seqs = held.sequences[:cfg.eval_prompts] if cfg.eval_prompts else held.sequences
    t0 = time.perf_counter()
    top1, first = teacher_forced(recipe, module, target_loaded, seqs, k, tokens, cfg.batch)
    chain = through_engine(recipe, module, target_loaded, seqs, k, tokens, first)
    same, compared = chain["first drafts as teacher-forced"]
    forced1, engine1 = chain["depth 1 at these steps"]
    say(f"held-out: loss {loss:.3f}; top-1 teacher-forced {_join(top1)}, in the engine "
        f"{_join(chain['depths'])}; alpha {chain['alpha']:.3f}, tau {chain['tau']:.2f} (chain, k={k}, "
        f"{len(seqs)} prompts)")
    if compared and same < 0.98 * compared:
        say(f"warning: only {same} of {compared} first drafts in the engine equal the teacher-forced ones: "
            "training and drafting disagree about what the drafter sees")
    out = {"prompts": len(seqs), "loss": round(loss, 4), "max new tokens": tokens,
           f"top-1 teacher-forced, every position (depth 1-{k})": [round(x, 4) for x in top1],
           f"acceptance in the engine, greedy chain (depth 1-{k})": [round(x, 4) for x in chain["depths"]],
           "depth 1 at the engine's steps (teacher-forced / engine)": [round(forced1, 4), round(engine1, 4)],
           "first drafts equal to the teacher-forced ones": f"{same} / {compared}",
           "outputs equal to the data's greedy text (written by its generator, often a bf16 copy)":
               f"{chain['same text']} / {len(seqs)}",
           f"alpha (greedy, k={k})": round(chain["alpha"], 4), f"tau (greedy, k={k})": round(chain["tau"], 3)}
    if getattr(recipe.drafter(module, target_loaded), "tree_width", 0) > 1 and _trees_here(target_loaded):
        out[f"tau (greedy, tree of {k} nodes)"] = round(
            through_engine(recipe, module, target_loaded, seqs, k, tokens, tree=True)["tau"], 3)
    for n in getattr(recipe, "eval_blocks", ()):  # a block drafter: longer blocks cost it no more to draft
        if n != k and n <= getattr(module, "size", n):
            longer = through_engine(recipe, module, target_loaded, seqs, n, tokens)
            out[f"acceptance in the engine, greedy chain (depth 1-{n})"] = [round(x, 4) for x in longer["depths"]]
            out[f"alpha (greedy, k={n})"], out[f"tau (greedy, k={n})"] = round(longer["alpha"], 4), round(longer["tau"], 3)
    out.update({"seconds": round(time.perf_counter() - t0, 1),
                "measured with": "specviz.engine.generate.speculative_generate"})
    return {"held-out": out}


@torch.no_grad()
def teacher_forced(recipe, module, target_loaded, seqs: list[Seq], depth: int, tokens: int,
                   batch: int) -> tuple[list[float], list[torch.Tensor]]:
    """(top-1 at depths 1..depth over the first `tokens` response tokens of each sequence,
    and per sequence its draft 1 after each context length n, -1 where it has none)."""
    hits, counts, first = [0] * depth, [0] * depth, []
    for i in range(0, len(seqs), batch):
        chunk = [crop(s, 0, s.response_start + tokens) for s in seqs[i:i + batch]]
        drafts = recipe.drafts(module, target_loaded, chunk, depth).cpu()
        for s, row in zip(chunk, drafts):
            L, P = len(s.ids), s.response_start
            first.append(row[:L, 0])
            for d in range(1, depth + 1):
                n = torch.arange(max(P, 1), L - d + 1)  # steps whose draft d is a token of the text
                got, want = row[n, d - 1], s.top_ids[n + d - 2, 0]
                ok = got >= 0
                hits[d - 1] += int((got[ok] == want[ok]).sum())
                counts[d - 1] += int(ok.sum())
    return [h / c if c else 0.0 for h, c in zip(hits, counts)], first


@torch.no_grad()
def through_engine(recipe, module, target_loaded, seqs: list[Seq], k: int, tokens: int,
                   first: list[torch.Tensor] | None = None, tree: bool = False) -> dict:
    """Greedy speculative decoding of each sequence's prompt: alpha, tau, the acceptance at
    each depth (among steps that drafted it with every earlier draft kept), how many outputs
    equal the stored text, and (with `first`) how many first drafts equal the teacher-forced
    ones where the engine's context is still the stored text."""
    from ..engine.generate import GenerationConfig, collect, speculative_generate

    # Only verdicts and token ids are read here: no top-k or raw log-probs per step (the bench's
    # setting too), which cost a full-vocabulary softmax and sort each step for nobody.
    gen = GenerationConfig(max_new_tokens=tokens, k=k, eos_token_ids=target_loaded.eos_token_ids, top=0, raw_top=0)
    outcomes = []  # (drafted, accepted) of every step, for the acceptance at each depth
    drafted = accepted = emitted = steps = same_text = equal = compared = forced_hits = engine_hits = 0
    for j, s in enumerate(seqs):
        P = max(1, s.response_start)  # the engine needs a token to start from
        drafter = recipe.drafter(module, target_loaded)
        if not tree:
            drafter.tree_width = 0
        events, end = collect(speculative_generate(target_loaded.model, drafter, s.ids[:P].tolist(), gen))
        stored = s.ids[P:P + len(end.token_ids)].tolist()
        agree = next((i for i, (a, b) in enumerate(zip(end.token_ids, stored)) if a != b), len(stored))
        same_text += agree == len(end.token_ids)
        for ev in events:
            outcomes.append((len(ev.draft), ev.accepted))
            n = P + ev.position  # this step drafts after context x_<n
            if first is not None and ev.draft and ev.position <= agree and n < len(first[j]):
                guess = int(first[j][n])
                compared += 1
                equal += ev.draft[0] == guess
                forced_hits += guess == int(s.top_ids[n - 1, 0])
                engine_hits += ev.accepted >= 1
        drafted, accepted = drafted + end.stats.drafted, accepted + end.stats.accepted
        emitted, steps = emitted + end.stats.tokens, steps + end.stats.steps
    depths = m.position_acceptance(*m.position_counts(outcomes, k))
    return {"alpha": m.acceptance_rate(accepted, drafted), "tau": m.mean_accepted_length(emitted, steps),
            "depths": [a or 0.0 for a in depths], "same text": same_text,
            "first drafts as teacher-forced": (equal, compared),
            "depth 1 at these steps": (forced_hits / max(1, compared), engine_hits / max(1, compared))}


def _trees_here(target_loaded) -> bool:
    """Whether the engine verifies tree drafts for this target (a fast-path cache)."""
    from ..engine.verify_step import trees_verifiable
    from ..modeling.forward import new_cache

    return trees_verifiable(new_cache(target_loaded.model))


def _join(xs: list[float]) -> str:
    return " / ".join(f"{x:.3f}" for x in xs)
