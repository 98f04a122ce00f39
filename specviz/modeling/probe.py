"""Before the first run: can the engine verify this model exactly? A few tiny forwards say.

Speculative decoding assumes three things of a model, and an architecture can break any of them
without its config saying so: its cache rolls back to an earlier token; one forward over several
new tokens gives a row of logits per token; and row i depends on tokens up to i only (a causal
model), so verifying k drafts at once scores each as decoding it alone would. A six-token probe
checks all three on the real model, in its real precision, once per model: a model that fails is
refused before any run, in one sentence that says what is missing, instead of a library's
traceback mid-run or, worse, a run that is silently not exact.
"""
from __future__ import annotations

import torch

from ..core.errors import SpecvizError
from .forward import forward, model_device, new_cache, output_vocab_size, rollback
from .stack import per_model

# Largest change of a log-probability (nats) between two computations that must agree, per
# precision, over the tokens of probability 1e-3 or more. A broken cache, a look-ahead or a wrong
# position moves them by far more; rounding in a batched forward by far less (a random model's
# near-uniform rows hide a look-ahead's change in probability, not in log-probability).
# A change is also counted relative to the row's spread of logits (max - min), which catches it in a
# random model whose logits are all nearly equal: rounding moves a logit by a small fraction of
# that spread (2^-23 of it in fp32, a few hundredths in a deep bf16 model), a look-ahead by much more.
AGREE = {torch.float32: 2e-3, torch.float64: 1e-6}
AGREE_HALF = 0.5
SPREAD = {torch.float32: 1e-3, torch.float64: 1e-6}
SPREAD_HALF = 0.1
SEEN = 1e-3


def _apart(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    """Do rows of logits `a` differ from `b` by more than rounding: in log-probability where `b` gives
    mass >= SEEN, or relative to each row's spread of logits?"""
    a, b = a.float(), b.float()
    la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    seen = lb.exp() >= SEEN
    nats = float((la - lb).abs()[seen].max()) if bool(seen.any()) else 0.0
    spread = (b.max(-1).values - b.min(-1).values).clamp_min(1e-12)
    shift = a - b - (a - b).mean(-1, keepdim=True)  # a constant shift of a row changes nothing
    relative = float((shift.abs().max(-1).values / spread).max())
    return nats > AGREE.get(dtype, AGREE_HALF) or relative > SPREAD.get(dtype, SPREAD_HALF)


# The probe's checks in the order it makes them: a forward that raises is reported with the check
# it was making, so a user reads what specviz tried before the library's own words.
CHECKS = (
    "one forward over 6 tokens gives a row of logits per token",
    "a changed last token leaves the earlier logits alone (a causal decoder)",
    "6 tokens in two forwards through its cache (4, then 2) match one forward",
    "a rollback to 4 tokens gives the last 2 the same logits again",
)


@per_model
def problem(model) -> str | None:
    """Why the engine cannot verify `model` exactly, or None. Cached per model object."""
    return _probe(model)


def check(model, name: str | None = None) -> None:
    """Raise SpecvizError naming what is missing when the engine cannot verify `model` exactly."""
    found = problem(model)
    if found:
        raise SpecvizError(f"{name or type(model).__name__} cannot be used for speculative decoding: {found}")


def _probe(model) -> str | None:
    vocab = output_vocab_size(model)
    device = model_device(model)
    dtype = next(model.parameters()).dtype
    ids = torch.tensor([(7 * i + 3) % vocab for i in range(6)], device=device)
    # Three far-apart replacements of the last token: one may barely move a small random model's
    # earlier rows, three together show a look-ahead (a tiny bidirectional encoder moved them by
    # 0.08% of their spread for one replacement and 0.2% for another).
    others = [ids.clone() for _ in range(3)]
    for j, other in enumerate(others, 1):
        other[-1] = (int(ids[-1]) + 1 + j * vocab // 4) % vocab
    try:
        cache = new_cache(model)
    except SpecvizError as e:
        return str(e).split(": ", 1)[-1]
    check = 0  # which of CHECKS is being made
    try:
        with torch.inference_mode():
            whole = forward(model, ids, cache)
            if whole.dim() != 2 or whole.shape[0] != len(ids):
                return (f"one forward over {len(ids)} tokens gave logits of shape {tuple(whole.shape)}, not a row per "
                        "token, so drafts cannot be verified in one pass")
            check = 1
            if any(_apart(forward(model, other, new_cache(model))[:-1], whole[:-1], dtype) for other in others):
                return ("changing the last token changed the logits of earlier ones: its attention looks ahead "
                        "(not a causal decoder), so a draft would be scored with tokens after it")
            # The same tokens in two forwards, then a rollback and the last two again: the cache's way.
            check = 2
            split = new_cache(model)
            first = forward(model, ids[:4], split)
            second = forward(model, ids[4:], split)
            if _apart(torch.cat([first, second]), whole, dtype):
                return ("its cache does not reproduce one forward's logits when the same tokens come in two parts, "
                        "so verifying after a cached context would not be exact")
            check = 3
            rollback(split, 4)
            again = forward(model, ids[4:], split)
            if _apart(again, whole[4:], dtype):
                return "after a rollback its cache gave other logits for the same tokens, so rejected drafts would linger"
    except SpecvizError as e:
        return str(e).split(": ", 1)[-1]
    except Exception as e:  # noqa: BLE001 - any library error becomes the sentence a user reads
        words = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]  # the sentence stays under 400
        return (f"specviz's probe checks that {CHECKS[check]} (check {check + 1} of {len(CHECKS)}), and there its "
                f"forward failed ({type(e).__name__}: {words})")
    return None
