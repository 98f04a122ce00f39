"""`python -m specviz audit`: is this engine's speculative sampling exact?

Draws --draws short completions (--tokens each) with speculation and as many without, one seed
each (the plain side's seeds are another range: the same seed on both sides would correlate
them and hide differences), for the temperature alone and with top-k/top-p, and tests that
both sides follow one distribution (stats.py); --against target tests the speculative side's
tokens against the target's own p instead (stats.exact_tests). The engine is

    local specviz       --target MODEL --drafter NAME (every drafter `generate` takes), --verification RULE
    transformers        --engine transformers --drafter pld (prompt lookup) or a draft model
                        (`draft`: the distilled drafter exported as a transformers model)
    a server            --server URL --baseline-server URL2 (the same model without speculation)

The default prompt asks again what was just answered, so prompt lookup drafts the earlier
answer from the first token and a sampled answer often refuses it. --lossy raw-q and --lossy
typical (specviz) and --ensemble-weight W (transformers) are controls that must fail
(controls.py). Exit status: 0 consistent with exact, 1 not exact, 3 no verdict (too few draws,
nothing drafted), 2 an error.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections import Counter
from dataclasses import replace

from ..core.errors import SpecvizError
from ..core.sampling import Sampling
from ..engine.generate import TREE_DRAFTINGS, VERIFICATIONS, GenerationConfig
from ..modeling import models
from ..modeling.chat import chat_messages
from ..modeling.text import encode_chat
from ..render.rules import comparable, kept
from ..run.arms import parse_arm
from ..run.prepare import on_stderr
from ..run.spec import build
from ..serving.client import server_version
from . import report
from .engines import PLAIN_SEEDS, Local, config, draws, outcomes, pair, served, target_p
from .stats import ALPHA, compare, exact_tests

RULE = GenerationConfig.verification  # the engine's default rule, as generate's and the app's

# A question asked twice: the conversation repeats, so prompt lookup copies the first answer.
TURNS = (("user", "Name one colour."), ("assistant", "Blue."), ("user", "Name one colour."))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="default", help="model id or folder ('default': the embedded SmolLM2-135M)")
    p.add_argument("--drafter", default="pld", help="the drafter, as `generate` names them (default pld); "
                   "with --engine transformers: pld, or a draft model (id, folder, or 'draft' for the distilled one)")
    p.add_argument("--engine", choices=("specviz", "transformers"), default="specviz",
                   help="the local engine that speculates (default specviz)")
    p.add_argument("--against", choices=("plain", "target"), default="plain", help="test the speculative draws "
                   "against as many plain ones (default), or against the target's exact p (a local target only)")
    p.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best available)")
    p.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: the device's)")
    p.add_argument("--k", type=int, default=4, help="draft length (default %(default)s)")
    p.add_argument("--verification", choices=VERIFICATIONS, default=None,
                   help=f"specviz's rule for a sampled chain draft: token by token or as a block (default "
                   f"{RULE}, as generate's)")
    p.add_argument("--tree-nodes-per-k", type=int, help="EAGLE's and Medusa's tree candidates per unit of k, trees at "
                   "any temperature (default: the engine's 2, trees up to temperature 0.85; 0: chains)")
    p.add_argument("--tree-drafting", choices=TREE_DRAFTINGS, default=GenerationConfig.tree_drafting,
                   help="a sampled tree's children chosen (the sibling walk) or drawn from q (default %(default)s)")
    p.add_argument("--draws", type=int, default=500, help="completions each way per setting (default %(default)s)")
    p.add_argument("--tokens", type=int, default=3, help="tokens per completion, tested jointly (default %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="(default %(default)s)")
    p.add_argument("--top-k", type=int, default=50, help="the second setting's top-k (default %(default)s; 0 = off)")
    p.add_argument("--top-p", type=float, default=0.9, help="the second setting's top-p (default %(default)s; "
                   "--top-k 0 --top-p 1: one setting only)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="both settings (1 = off)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--prompt", help="one user turn instead of the default repeated question")
    p.add_argument("--alpha", type=float, default=ALPHA, help="fail below this p over all tests (default %(default)s)")
    p.add_argument("--time-cap", type=float, default=0, metavar="SECONDS",
                   help="stop drawing after this long and judge what was drawn (default: no cap)")
    p.add_argument("--json", metavar="FILE", help="also write the results (specviz-audit v1) to FILE")
    c = p.add_argument_group("controls that must fail")
    c.add_argument("--lossy", choices=("raw-q", "typical"), help="specviz with q taken before the warpers "
                   "(raw-q: transformers issue #47932, for a draft-model drafter), or with Medusa's typical "
                   "acceptance (typical: a draft token kept when the target finds it likely enough, no draw)")
    c.add_argument("--ensemble-weight", type=float, help="transformers' assistant_ensemble_weight (DIVERSE "
                   "verification, lossy by design)")
    s = p.add_argument_group("a serving engine instead of a local model")
    s.add_argument("--server", metavar="URL", help="an OpenAI-compatible server with speculation (vLLM, llama.cpp)")
    s.add_argument("--baseline-server", metavar="URL", help="the same model served without speculation")
    s.add_argument("--model", help="the served model's name (default: the first the server lists)")


def settings(args) -> list[Sampling]:
    """The temperature alone, then with top-k/top-p (unless both are off)."""
    plain = Sampling(temperature=args.temperature, repetition_penalty=args.repetition_penalty).validate()
    if plain.greedy:
        raise SpecvizError("the audit samples: give a temperature above 0 (greedy runs are compared token for "
                           "token by `generate`)")
    filtered = replace(plain, top_k=args.top_k, top_p=args.top_p).validate()
    return [plain] if filtered == plain else [plain, filtered]


def describe(s: Sampling) -> str:
    parts = [f"temperature {s.temperature:g}"]
    parts += [f"top-k {s.top_k}"] if s.top_k else []
    parts += [f"top-p {s.top_p:g}"] if s.top_p < 1 else []
    parts += [f"repetition penalty {s.repetition_penalty:g}"] if s.repetition_penalty != 1 else []
    return ", ".join(parts)


def check(args) -> None:
    if args.draws < 1 or args.tokens < 1 or args.k < 1:
        raise SpecvizError("--draws, --tokens and --k must be at least 1")
    if args.against == "target" and args.server:
        raise SpecvizError("--against target reads the target's own p, which a server does not send")
    if bool(args.server) != bool(args.baseline_server):
        raise SpecvizError("--server and --baseline-server go together: the audit compares the engine with "
                           "speculation against the same model without")
    if args.model and not args.server:
        raise SpecvizError("--model goes with --server")
    if args.lossy and (args.server or args.engine != "specviz"):
        raise SpecvizError("--lossy is a control for specviz's own engine")
    if args.lossy == "typical" and args.verification:
        raise SpecvizError("--lossy typical is its own verification rule: leave out --verification")
    if (args.verification or args.tree_nodes_per_k is not None) and (args.server or args.engine != "specviz"):
        raise SpecvizError("--verification and --tree-nodes-per-k choose specviz's own rules: the other engines "
                           "verify their way")
    if args.ensemble_weight is not None and args.engine != "transformers":
        raise SpecvizError("--ensemble-weight is transformers' option: add --engine transformers")


def engines(args, watch=None):
    """(a function from a Sampling to (speculative, plain) engines, a function from an outcome
    to text, what was audited, a function from a Sampling and tokens to the target's p after
    them: None for a server). `watch` sees specviz's speculative steps."""
    turns = [("user", args.prompt)] if args.prompt else list(TURNS)
    if args.server:
        messages, urls = chat_messages(turns), (args.server, args.baseline_server)
        what = {"server": args.server, "server_version": server_version(args.server),
                "baseline_server": args.baseline_server, "baseline_version": server_version(args.baseline_server)}
        return lambda s: served(urls, messages, s, args.tokens, args.model, args.k), lambda o: "".join(o), what, None
    progress, arm = on_stderr(), parse_arm(args.drafter, GenerationConfig())  # NAME@chain drafts chains here too
    target = models.load(args.target, device=args.device, dtype=args.dtype, progress=progress)
    ids = encode_chat(target.tokenizer, chat_messages(turns)) if target.is_chat else \
        list(target.tokenizer(" ".join(t for _, t in turns))["input_ids"])
    eos = target.eos_token_ids

    def show(o):
        return repr(models.decode(target, o))[1:-1]

    def exact(s, tokens):
        return target_p(target.model, ids + list(tokens), s)

    what = {"target": args.target, "drafter": args.drafter, "engine": args.engine, "prompt_tokens": len(ids),
            "verification": args.verification or RULE}
    if args.engine == "transformers":
        peer, assistant = "hf-pld", None
        if arm.spec.kind.name != "pld":
            from ..bench.drafters import DRAFT_HF, make_drafters

            name = DRAFT_HF if args.drafter.strip() == "draft" else args.drafter
            peer, assistant = "hf-assisted", make_drafters([name], target)[0].model
            if assistant is None:
                raise SpecvizError(f"transformers' generate takes a draft model or prompt lookup, not {args.drafter!r}")
        extra = {} if args.ensemble_weight is None else {"assistant_ensemble_weight": args.ensemble_weight}
        return (lambda s: pair(target.model, assistant, ids, config(s, args.tokens, args.k, eos, room=0), args.tokens,
                               peer, extra)), show, what, exact  # generate: no room past the tested tokens
    drafter = build(arm.spec, target, progress=progress)
    if drafter is None:
        raise SpecvizError("the drafter 'none' drafts nothing: there would be no speculation to audit")
    nodes = args.tree_nodes_per_k
    # Given, trees at any temperature with room for a whole first tree (a step drafts no more than the room left).
    trees = {} if nodes is None else {"tree_nodes_per_k": nodes, "sampled_trees_up_to": math.inf,
                                      "room": (nodes or 1) * args.k}

    def cfg(s):
        return config(s, args.tokens, args.k, eos, args.verification or RULE, chains=arm.cfg.chains or nodes == 0,
                      tree_drafting=args.tree_drafting, **trees)

    if args.lossy == "typical":
        from .controls import Typical

        what["verification"] = "Medusa's typical acceptance"
        return (lambda s: (Typical(target.model, drafter, ids, s, args.tokens, args.k, eos),
                           pair(target.model, None, ids, cfg(s), args.tokens)[1])), show, what, exact
    if args.lossy:
        from .controls import RawQ

        drafter = RawQ(drafter)
    return lambda s: pair(target.model, drafter, ids, cfg(s), args.tokens, watch=watch), show, what, exact


def step_counts(seen: Counter):
    """A watch counting into `seen` steps that drafted a tree (drawn from q), judged a sibling after a
    rejection, or (chains) would keep another count under the other rule on the same draws."""

    def watch(ev):
        if (t := ev.tree) is not None:
            seen.update(trees=1, drawn=bool(t.q), siblings=len(t.walk) > len({t.parents[i] for i in t.walk}))
        seen["differed"] += comparable(ev) and len(set(kept(ev).values())) > 1
    return watch


def draw_all(engines, n: int, first_seed: int, deadline: float | None, label: str, every: float = 5.0):
    """Every engine's draws (engines.draws), a list each, telling progress on stderr; stop at the deadline."""
    rows, shown, start = [], time.monotonic(), time.monotonic()
    each = " each way" if len(engines) > 1 else ""
    for row in draws(engines, n, first_seed, lambda: deadline is not None and time.monotonic() > deadline):
        rows.append(row)
        now = time.monotonic()
        if now - shown > every and len(rows) < n:
            shown = now
            left = (now - start) / len(rows) * (n - len(rows)) / 60
            print(f"audit: {label}: {len(rows)} of {n} draws{each}, ~{left:.1f} min left", file=sys.stderr, flush=True)
    if len(rows) < n:
        print(f"audit: {label}: the time cap stopped the draws at {len(rows)}{each}", file=sys.stderr, flush=True)
    return [[row[j] for row in rows] for j in range(len(engines))]


def audit_one(spec, plain, s: Sampling, args, show, deadline) -> dict:
    label = describe(s)
    a, b = draw_all((spec, plain), args.draws, args.first_seed, deadline, label)
    both, depth = outcomes(a + b, args.tokens)
    sa, sb = both[:len(a)], both[len(a):]
    c = compare(sa, sb, depth, args.alpha)
    drafted, accepted = sum(d.drafted for d in a), sum(d.accepted for d in a)
    word, sentence = report.verdict(c, drafted, accepted)
    return {"setting": label, "sampling": {k: v for k, v in s.__dict__.items() if k != "seed"},
            "speculative": spec.settings(), "plain": plain.settings(), "verdict": word, "sentence": sentence,
            "drafted": drafted, "accepted": accepted, "refused": drafted - accepted,
            "comparison": c.to_dict(), "outcomes": report.side_by_side(sa, sb, depth, show)}


def audit_against_target(spec, s: Sampling, args, show, deadline, exact, seen: Counter) -> dict:
    """One setting's speculative draws, each token tested against the target's exact p (stats.exact_tests);
    `seen`: what a specviz engine's steps drafted (step_counts)."""
    label = describe(s)
    drawn, = draw_all((spec,), args.draws, args.first_seed, deadline, label)
    tests = exact_tests([d.tokens for d in drawn], lambda tokens: exact(s, tokens), args.tokens, show)
    drafted, accepted = sum(d.drafted for d in drawn), sum(d.accepted for d in drawn)
    word, sentence = report.fit_verdict([t for t, _ in tests], len(drawn), drafted, args.alpha)
    return {"setting": label, "sampling": {k: v for k, v in s.__dict__.items() if k != "seed"},
            "speculative": spec.settings(), "verdict": word, "sentence": sentence, "drafted": drafted,
            "accepted": accepted, "refused": drafted - accepted, "draws": len(drawn),
            "tests": [{**t.to_dict(), "draws": n} for t, n in tests],
            "steps": {k: seen[k] for k in ("trees", "drawn", "siblings", "differed")} if isinstance(spec, Local)
            else None}


def versions() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def main(args) -> int:
    check(args)
    samplings = settings(args)
    seen = Counter()  # what specviz's speculative steps drafted, for --against target
    make, show, what, exact = engines(args, step_counts(seen))
    if args.server:
        told = [what["server_version"] or "version not told", what["baseline_version"] or "version not told"]
        print(f"servers: {args.server} ({told[0]}), without speculation {args.baseline_server} ({told[1]})")
        if told[0] != told[1]:
            print("  the two servers report different builds: a difference may be the build's, not speculation's")
    deadline = time.monotonic() + args.time_cap if args.time_cap else None
    results = []
    for s in samplings:
        spec, plain = make(s)
        seen.clear()
        if args.against == "target":
            results.append(audit_against_target(spec, s, args, show, deadline, exact, seen))
            report.print_fit(results[-1])
        else:
            results.append(audit_one(spec, plain, s, args, show, deadline))
            report.print_result(results[-1])
    if args.json:
        data = {"format": report.FORMAT, "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
                "versions": versions(), "command": "python -m specviz " + " ".join(sys.argv[1:]),
                "audited": what, "against": args.against, "draws": args.draws, "tokens": args.tokens,
                "first_seed": args.first_seed, "plain_seeds_from": args.first_seed + PLAIN_SEEDS, "results": results}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    words = {r["verdict"] for r in results}
    return 1 if report.NOT_EXACT in words else 3 if report.NO_VERDICT in words else 0
