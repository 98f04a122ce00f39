"""Do a drafter's sampled runs on the embedded model follow the target's own distribution?

    python scripts/sampling_check.py --drafter eagle --runs 1500 [--first-seed 0] [--follow-up] [--tree-nodes 8]
        [--verification block] [--tree-drafting drawn] [--target default] [--device cpu] [--dtype fp32]

Runs speculative sampling (T = 0.8 by default, k = 4) once per seed on one short chat prompt, drawn
as every exactness check draws (specviz/audit/engines.py), and tests, by chi-square, the first sampled token against the target's exact distribution, the second
given the likeliest first, and the third given the likeliest first two (cells with an expected
count under 5 are pooled). The exact-by-enumeration tests in tests/ prove the rejection sampling
and both rules for sampled trees (the sibling walk for chosen children, recursive rejection sampling
for children drawn from q: --tree-drafting, default the engine's); this checks that real weights (a new EAGLE head, a hybrid)
change nothing. EAGLE and Medusa draft trees of --tree-nodes candidates (0: chains): each run
stops once three tokens are out, so the first step's tree is not cut to the three tokens asked
for, and the line after the tests says how many steps drafted a tree and how many of those
judged a sibling after a rejection. Chain drafts are judged as the engine judges them, as a
block by default (core/block_verify.py; --verification token: token by token); the last line then
says on how many steps the two rules, on the same draws, would have kept different counts. With --follow-up the prompt
is a second request after a first answer, so the context ends as the answer's turn began and prompt
lookup copies that answer's first tokens at the first step (a `NAME+pld` pair drafts by lookup there).
--target, --device and --dtype run it on another model (a draft model folder for --drafter), on a GPU, in half
precision: the check compares against the target's own distribution in the same dtype and place.
Prints one line per token and exits 1 when any p is below --alpha. Takes ~0.2 s a run on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys
from collections import Counter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

import torch  # noqa: E402
from scipy.stats import chisquare  # noqa: E402

from specviz import GenerationConfig, Sampling  # noqa: E402
from specviz.audit.engines import Local, draws  # noqa: E402
from specviz.run.spec import make_drafter  # noqa: E402
from specviz.engine.generate import TREE_DRAFTINGS, VERIFICATIONS  # noqa: E402
from specviz.render.rules import comparable, kept  # noqa: E402
from specviz.modeling.chat import chat_messages  # noqa: E402
from specviz.modeling.models import load  # noqa: E402
from specviz.modeling.text import encode_chat  # noqa: E402

PROMPT = "Write one sentence about the sea."
FOLLOW_UP = [("assistant", "The sea is vast, deep and full of life."),
             ("user", "Write another sentence about the sea.")]


def exact(model, ids: list[int], temperature: float) -> torch.Tensor:
    """The target's next-token distribution after `ids` at this temperature."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=model.device)).logits[0, -1].float()
    return torch.softmax(logits / temperature, -1)


def test(counts: Counter, p: torch.Tensor) -> tuple[float, int]:
    """Chi-square p-value of `counts` against distribution p, cells pooled to expected >= 5."""
    n = sum(counts.values())
    expected = p * n
    big = [t for t in torch.argsort(expected, descending=True).tolist() if expected[t] >= 5]
    observed = [counts.get(t, 0) for t in big] + [n - sum(counts.get(t, 0) for t in big)]
    wanted = [expected[t].item() for t in big] + [n - sum(expected[t].item() for t in big)]
    if wanted[-1] < 5 and len(big) > 1:  # too little left over for a cell of its own: fold it into the last
        observed[-2] += observed.pop()
        wanted[-2] += wanted.pop()
    if len(observed) < 2:  # too few runs reached this prefix for a test (a smoke run)
        return 1.0, len(big)
    return chisquare(observed, wanted).pvalue, len(big)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="eagle")
    ap.add_argument("--runs", type=int, default=1500)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.01, help="fail below this p (default 0.01)")
    ap.add_argument("--follow-up", action="store_true",
                    help="ask again after a first answer, so prompt lookup copies at the first step")
    ap.add_argument("--tree-nodes-per-k", type=int, default=GenerationConfig.tree_nodes_per_k,
                    help="candidates per tree step for EAGLE and Medusa, per unit of k (default %(default)s, as the "
                    "app; 0: chains); trees at any temperature, so the check covers them")
    ap.add_argument("--verification", choices=VERIFICATIONS, default=GenerationConfig.verification,
                    help="how chain drafts are judged: token by token or as a block (default %(default)s, as the "
                    "engine); trees take the sibling walk")
    ap.add_argument("--tree-drafting", choices=TREE_DRAFTINGS, default=GenerationConfig.tree_drafting,
                    help="how EAGLE's and Medusa's tree children are found: chosen (the sibling walk judges them) or "
                    "drawn from q (recursive rejection sampling) (default %(default)s, as the engine)")
    ap.add_argument("--target", default="default", help="model id or folder (default: the embedded model)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or mps (default cpu)")
    ap.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: the device's)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    target = load(args.target, device=args.device, dtype=args.dtype)
    ids = encode_chat(target.tokenizer, chat_messages([("user", PROMPT)] + (FOLLOW_UP if args.follow_up else [])))
    drafter = make_drafter(args.drafter, target)
    # Room for a whole tree at the first step (a step drafts no more than the run can still emit);
    # each draw is left once three tokens are out.
    cfg = GenerationConfig(max_new_tokens=3 + args.k * max(1, args.tree_nodes_per_k), k=args.k,
                           tree_nodes_per_k=args.tree_nodes_per_k, sampled_trees_up_to=math.inf, raw_top=0, top=0,
                           sampling=Sampling(temperature=args.temperature), verification=args.verification,
                           tree_drafting=args.tree_drafting, chains=not args.tree_nodes_per_k)  # 0: chains, NAME@chain
    seen = Counter()

    def watch(ev):
        seen["trees"] += ev.tree is not None
        seen["drawn"] += ev.tree is not None and bool(ev.tree.q)
        seen["siblings"] += ev.tree is not None and len(ev.tree.walk) > len({ev.tree.parents[i] for i in ev.tree.walk})
        seen["differed"] += comparable(ev) and len(set(kept(ev).values())) > 1

    engine = Local(target.model, drafter, ids, cfg, 3, watch=watch)
    runs = [d.tokens for d, in draws([engine], args.runs, args.first_seed)]
    failed, prefix = False, []
    for depth in range(3):
        p = exact(target.model, ids + prefix, args.temperature)
        counts = Counter(r[depth] for r in runs if len(r) > depth and list(r[:depth]) == prefix)
        pvalue, cells = test(counts, p)
        failed |= pvalue < args.alpha
        given = f" given {target.tokenizer.decode(prefix)!r}" if prefix else ""
        print(f"{args.drafter}: token {depth + 1}{given}: p = {pvalue:.3f} ({sum(counts.values())} runs, "
              f"{cells + 1} cells)")
        prefix = prefix + [int(torch.argmax(p))]
    print(f"{args.drafter}: {seen['trees']} steps drafted a tree ({seen['drawn']} drawn from q); {seen['siblings']} of "
          "them judged a sibling after a rejection")
    print(f"{args.drafter}: judged {args.verification}; on {seen['differed']} chain steps token-wise and block "
          "verification would have kept different counts with the same draws")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
