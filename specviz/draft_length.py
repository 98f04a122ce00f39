"""Choosing each step's draft length from what drafting and verifying really cost.

With acceptance rate alpha per draft token (independent, as in Leviathan et al.), a draft
of j tokens yields E(j) = (1 - alpha^(j+1)) / (1 - alpha) tokens per step, and costs
T(j + 1) (a target forward over j + 1 tokens) plus j * c_draft. Dynamic k picks the j in
0..k_max with the most tokens per second, from running estimates of all three:

- alpha: discounted counts of accepted / rejected draft tokens (recent steps weigh
  more, and an idle estimate drifts back to the prior, so a drafter that was unlucky
  gets tried again instead of being shut off for good). Drafts whose drafter names their
  kind (`Drafter.plan`: prompt lookup's n-gram length; a hybrid's model drafts) get a rate
  per kind, whose prior is the overall rate;
- T(m): the measured verify time for each m seen, interpolated between them and
  extrapolated along the line through the nearest two (with one measurement, a gentle
  assumed slope, so that long drafts get tried when alpha is high), and never above a
  larger size's measurement;
- c_draft: measured draft seconds per drafted token, per kind where kinds are named (a
  hybrid's copied drafts cost ~nothing, its model's do not).
"""
from __future__ import annotations

from .theory import expected_tokens

DISCOUNT = 0.7  # weight of the past per step in the alpha estimate: a memory of ~3 steps
IDLE_DISCOUNT = 0.9  # per step without a draft (of that kind): a memory of ~10 such steps
PRIOR = 0.5  # pseudo-counts each way: alpha starts at 0.5, and evidence soon outweighs it
SLOPE = 0.05  # assumed extra cost per verified token, as a fraction of T(1), where unmeasured


class DraftLength:
    def __init__(self, k: int, k_max: int, dynamic: bool):
        self.k, self.k_max, self.dynamic = k, k_max, dynamic
        self.accepted = self.rejected = 0.0
        self.by_kind: dict[int, tuple[float, float]] = {}  # kind -> (accepted, rejected), discounted
        self.verify: dict[int, float] = {}  # m tokens verified -> EMA seconds
        self.draft_per_token: float | None = None
        self.cost_by_kind: dict[int, float] = {}  # kind -> EMA draft seconds per drafted token

    @property
    def alpha(self) -> float:
        return (self.accepted + PRIOR) / (self.accepted + self.rejected + 2 * PRIOR)

    def alpha_of(self, kind=None) -> float:
        """The acceptance rate of drafts of this kind (the overall rate for None)."""
        if kind is None or kind not in self.by_kind:
            return self.alpha
        acc, rej = self.by_kind[kind]
        return (acc + 2 * PRIOR * self.alpha) / (acc + rej + 2 * PRIOR)

    def verify_cost(self, m: int) -> float | None:
        """Estimated seconds to verify m tokens, from the measurements made monotone first:
        a forward over more tokens does not cost less, so a size measured once, early (the
        first step after prefill runs slow) and never again cannot look dearer than a larger
        size measured since, nor bend the extrapolation downwards."""
        if not self.verify:
            return None
        known = sorted(self.verify)
        cost, floor = {}, float("inf")
        for x in reversed(known):  # suffix minimum
            floor = min(floor, self.verify[x])
            cost[x] = floor
        if m in cost:
            return cost[m]
        lower = [x for x in known if x < m]
        upper = [x for x in known if x > m]
        if lower and upper:  # interpolate between the nearest measurements
            a, b = lower[-1], upper[0]
            w = (m - a) / (b - a)
            return cost[a] * (1 - w) + cost[b] * w
        if len(known) >= 2:  # extend the line through the two nearest measurements
            a, b = (known[-2], known[-1]) if lower else (known[0], known[1])
            slope = (cost[b] - cost[a]) / (b - a)
            return max(cost[a] + slope * (m - a), 0.5 * cost[known[0]])
        # One measurement: assume each extra verified token costs SLOPE of a 1-token step.
        only = known[0]
        t1 = cost[only] / (1 + SLOPE * (only - 1))
        return t1 * (1 + SLOPE * (m - 1))

    def next(self, kind=None) -> int:
        """The draft length for the coming step (for a draft of this kind, when known)."""
        if not self.dynamic:
            return self.k
        if not self.verify:
            return self.k  # nothing measured yet: start where the user said
        alpha, c = self.alpha_of(kind), self.cost_by_kind.get(kind, self.draft_per_token) or 0.0
        best_j, best_rate = 0, 0.0
        for j in range(self.k_max + 1):
            rate = expected_tokens(alpha, j) / (self.verify_cost(j + 1) + c * j)
            if rate > best_rate:
                best_j, best_rate = j, rate
        return best_j

    def record(self, drafted: int, accepted: int, draft_time: float, verify_time: float, kind=None) -> None:
        """What one step did: feeds the estimates behind `next`."""
        m = drafted + 1
        self.verify[m] = _ema(self.verify.get(m), verify_time)
        if drafted:
            per = draft_time / drafted
            self.draft_per_token = _ema(self.draft_per_token, per)
            if kind is not None:
                self.cost_by_kind[kind] = _ema(self.cost_by_kind.get(kind), per)
        self.accepted, self.rejected = _counted(self.accepted, self.rejected, drafted, accepted)
        if kind is not None:
            self.by_kind[kind] = _counted(*self.by_kind.get(kind, (0.0, 0.0)), drafted, accepted)


def _ema(old: float | None, new: float) -> float:
    return new if old is None else 0.8 * old + 0.2 * new


def _counted(acc: float, rej: float, drafted: int, accepted: int) -> tuple[float, float]:
    """Discounted (accepted, rejected) counts after a step that drafted `drafted` tokens."""
    if not drafted:  # not tried: the memory fades slowly, so an unlucky drafter is tried again
        return IDLE_DISCOUNT * acc, IDLE_DISCOUNT * rej
    # The tokens after the first rejection were never judged: count only up to it.
    return DISCOUNT * acc + accepted, DISCOUNT * rej + (1 if accepted < drafted else 0)
