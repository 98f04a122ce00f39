"""A run in the terminal: its tokens coloured by what happened to each, and the summary lines.

`generate` prints a live run with these, `replay` a saved one (trace_command.py): both here, so
neither command imports the other.
"""
from __future__ import annotations

import os

from ..render.kinds import shown_tokens

# Terminal colours per token kind; rejected drafts are struck through.
ANSI = {"accepted": "\033[34m", "rejected": "\033[9;31m", "corrected": "\033[33m", "bonus": "\033[36m"}
RESET = "\033[0m"
# Without colour, the same information in brackets: [-rejected] ~corrected~ {bonus}.
PLAIN = {"accepted": "{}", "rejected": "[-{}]", "corrected": "~{}~", "bonus": "{{{}}}"}


def use_colour(stream) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


def print_coloured(target, steps, out, labels=None, each=None) -> None:
    """Each step's kept drafts, its rejected drafts (where they were proposed), then its own token.

    labels: each step's display text (labels.Labeler's); worked out here when not given.
    `target` needs only eos_token_ids when they are given (a replay has no model).
    each: called with each step before it is printed (a replay paces or numbers steps with it).
    """
    if labels is None:
        from ..modeling import models
        from ..traces.labels import Labeler

        labeler = Labeler(models, target, [])
        labels = [labeler.label(s) for s in steps]
    colour = use_colour(out)
    for s, shown in zip(steps, labels):
        if each is not None:
            each(s)
        ids = list(s.draft) + [s.token]
        texts = shown.draft + (shown.token,)
        for kind, i in shown_tokens(s):
            if kind != "rejected" and ids[i] in target.eos_token_ids:
                continue  # the end-of-turn token that stopped the run (a rejected one still shows)
            out.write(f"{ANSI[kind]}{texts[i]}{RESET}" if colour else PLAIN[kind].format(texts[i]))
    out.write("\n\n")


def print_summary(r, out) -> None:
    st = r["stats"]
    out.write(
        f"drafter {r['label']}: {st['tokens']} tokens in {st['steps']} steps, "
        f"{st['target_calls']} target calls; alpha {st['acceptance_rate']:.2f}, "
        f"tau {st['mean_accepted_length']:.2f}, {st['tokens_per_s']:.1f} tokens/s\n"
    )
    if st.get("stop_reason") == "context":  # the run stopped before --max-new-tokens: say why
        out.write(f"the run ended because the model's context is full ({r['prompt_tokens']} prompt tokens "
                  f"and {st['tokens']} new)\n")
    if "baseline" in r:
        b = r["baseline"]
        out.write(f"baseline: {b['stats']['tokens']} tokens, {b['tokens_per_s']:.1f} tokens/s; "
                  f"speedup {r['speedup']:.2f}x\n")
        if "identical_to_baseline" in r:
            out.write(f"greedy output identical to baseline: {'yes' if r['identical_to_baseline'] else 'no'}\n")
            if r.get("divergence"):
                out.write(f"{r['divergence']['sentence']} (docs/exactness.md)\n")
        else:
            out.write("sampling: texts differ run to run, but both follow the target's distribution\n")
    if not use_colour(out):
        out.write("legend: accepted [-rejected] ~corrected~ {bonus}\n")
    else:
        out.write("legend: " + " ".join(f"{ANSI[k]}{k}{RESET}" for k in ANSI) + "\n")
