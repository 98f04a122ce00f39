"""The maths of the distribution view: one position of one step, p against q.

A step records, per position, the top tokens of the target and the drafter as temperature-1
log-probs (StepEvent.p_raw, q_raw). From those this module reshapes both with any
temperature and top-p, and computes what speculative sampling does with them:

- overlap = sum_x min(p(x), q(x)): the probability that the drafter's token is accepted
  (its expectation over the drafter's draw);
- residual = norm(max(0, p - q)): what the corrected token is drawn from after a rejection;
- a draft token x is kept when the uniform draw u < min(1, p(x) / q(x));
- a sampled tree's children are one-hot guesses tried in order: p′ after refusing some is p
  without them, renormalised (`without`).

Only the recorded top tokens are known. The rest of each distribution ("other tokens") is
one lump whose temperature-1 mass is known; reshaped, it is estimated as if spread evenly
over tokens as likely as the least likely recorded one. Pure functions over plain floats.
"""
from __future__ import annotations

import math

REST = -1  # the id standing for every token outside the recorded top


def reshape(raw, temperature: float = 1.0, top_p: float = 1.0) -> dict[int, float]:
    """{token: prob} over the recorded tokens and REST, as the sampler would see them with
    `temperature` and `top_p` (temperature 0: greedy, all mass on the top token)."""
    raw = [(t, lp) for t, lp in raw if lp > -1e3]  # tokens a top-k / top-p cut removed have ~0 mass
    if not raw:
        return {}
    rest = max(0.0, 1.0 - sum(math.exp(lp) for _, lp in raw))
    if temperature <= 0:
        return {max(raw, key=lambda x: x[1])[0]: 1.0}
    top = max(lp for _, lp in raw)
    weights = {t: math.exp((lp - top) / temperature) for t, lp in raw}
    floor = min(lp for _, lp in raw)
    if rest > 1e-9:
        # rest / exp(floor) tokens at the floor's log-prob, each reweighted like it
        weights[REST] = rest / math.exp(floor) * math.exp((floor - top) / temperature)
    total = sum(weights.values())
    probs = {t: w / total for t, w in weights.items()}
    return nucleus(probs, top_p) if top_p < 1.0 else probs


def nucleus(probs: dict[int, float], top_p: float) -> dict[int, float]:
    """Keep the most likely tokens until their mass reaches top_p (at least one), renormalise.
    REST sorts last: it is many small tokens, not one large one."""
    order = sorted(probs, key=lambda t: (t == REST, -probs[t]))
    kept, before = {}, 0.0
    for t in order:
        if before >= top_p:
            break
        kept[t] = probs[t]
        before += probs[t]
    total = sum(kept.values())
    return {t: p / total for t, p in kept.items()}


def overlap(p: dict[int, float], q: dict[int, float]) -> float:
    """sum min(p, q) over the named tokens (REST is not one token on both sides: left out)."""
    return sum(min(p[t], q.get(t, 0.0)) for t in p if t != REST)


def residual(p: dict[int, float], q: dict[int, float]) -> dict[int, float]:
    """norm(max(0, p - q)): the corrected token's distribution after a rejection ({} if p = q)."""
    r = {t: max(0.0, pt - q.get(t, 0.0)) for t, pt in p.items()}
    total = sum(r.values())
    return {t: x / total for t, x in r.items()} if total > 1e-12 else {}


def accept_prob(p: dict[int, float], q: dict[int, float], token: int) -> float:
    """min(1, p(x) / q(x)) for a drafted token x (a token q gives nothing to is never drafted: 1)."""
    qx = q.get(token, 0.0)
    return 1.0 if qx <= 0 else min(1.0, p.get(token, 0.0) / qx)


def one_hot(token: int) -> dict[int, float]:
    """A drafter that gives a token and no distribution (prompt lookup): q is all on it."""
    return {token: 1.0}


def without(p: dict[int, float], refused) -> dict[int, float]:
    """p′ after a tree's sibling walk refused `refused` (core/tree_sampling.py): p with those
    tokens removed and the rest divided by the mass they leave ({} if they held it all)."""
    kept = {t: x for t, x in p.items() if t not in refused}
    total = sum(kept.values())
    return {t: x / total for t, x in kept.items()} if total > 1e-12 else {}
