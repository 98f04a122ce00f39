"""What verifying m tokens costs, learned while decoding (dynamic k's estimate): T(m) = T(1) * v(m).

The machine's speed T(1) drifts quickly (caches warm up after prefill, another process
starts); the shape v(m) of the cost curve belongs to the model and the hardware and drifts
slowly. Every step times one size m, and that time says something about both. Tracking
them apart, in log seconds, with a Kalman filter over (log T(1), log v(m) per size timed),
gives what per-size averages did not:

- a slow step (the first after prefill, a busy moment) moves mostly the speed, which the
  next steps correct: it cannot price one size out for good;
- a size timed long ago is priced at today's speed, since any size's time updates it;
- a size not timed for a while drifts back to a gentle prior shape, with its uncertainty,
  so it looks cheap enough to be tried again instead of keeping a stale cost forever;
- the covariance remembers what is known only jointly: after many steps of one size, its
  time is known but not how it splits into speed and shape, and the next plain step's time
  corrects the shape;
- a time far slower than predicted is a hiccup until the next one agrees (timing noise is
  one-sided: nothing runs much faster than it can), then a change of load.
"""
from __future__ import annotations

import math

SLOPE = 0.05  # prior shape v(m) = 1 + SLOPE (m - 1): near a GPU's flat curve, below fp32 CPU's
SHAPE_VAR = 0.5 ** 2  # prior variance of log v(m): within ~0.6-1.6x of the prior is plausible
REVERT = 0.97  # per step, an untimed size's shape keeps this much of what it learned (half-life ~23 steps)
FIRST_VAR = 0.5 ** 2  # the speed's variance after the first step: that step is known to run slow
SPEED_DRIFT = 0.02 ** 2  # least variance the speed gains per step; more where the load has been moving
DRIFT_MEMORY = 0.9  # per step, the weight of the past in the estimate of how much the speed moves
NOISE = 0.1 ** 2  # variance of one timing, in log seconds
OUTLIER = 2.5  # standard deviations beyond which a slower time is a hiccup or a change of load


def prior_shape(m: int) -> float:
    """The prior log v(m)."""
    return math.log1p(SLOPE * (m - 1))


class VerifyCost:
    def __init__(self):
        self.steps = 0  # timings seen
        self.sizes: list[int] = []  # the sizes m > 1 timed so far, in state order after the speed
        self.x: list[float] = []  # [log T(1), log v(m) for m in sizes]
        self.p: list[list[float]] = []  # their covariance
        self.timed: dict[int, int] = {}  # m -> the step it was last timed
        self.drift = SPEED_DRIFT  # how far (variance) the speed moves per step, lately
        self.slow = False  # the last timing was far slower than predicted

    def age(self, m: int) -> float:
        """Steps since a verify over m tokens was last timed (inf: never)."""
        return self.steps - self.timed[m] if m in self.timed else math.inf

    @property
    def t1(self) -> float | None:
        """Seconds of a one-token verify now (None before any timing)."""
        return math.exp(self.x[0]) if self.x else None

    def observe(self, m: int, seconds: float) -> None:
        """One verify over m tokens took `seconds`."""
        y = math.log(max(seconds, 1e-9))
        if not self.x:  # the first timing sets the speed, uncertainly; shapes keep their prior
            self.x, self.p = [y - prior_shape(m)], [[FIRST_VAR]]
        else:
            self._elapse()
            if m > 1 and m not in self.sizes:
                self._add(m)
            self._update(m, y)
        self.timed[m] = self.steps
        self.steps += 1

    def _elapse(self) -> None:
        """One step passes: the speed may have moved, shapes drift back towards the prior."""
        n, p = len(self.x), self.p
        for i in range(1, n):
            self.x[i] = prior_shape(self.sizes[i - 1]) + REVERT * (self.x[i] - prior_shape(self.sizes[i - 1]))
            p[0][i] = p[i][0] = REVERT * p[0][i]
            for j in range(1, n):
                p[i][j] *= REVERT * REVERT
            p[i][i] += (1 - REVERT * REVERT) * SHAPE_VAR
        p[0][0] += self.drift

    def _add(self, m: int) -> None:
        self.sizes.append(m)
        self.x.append(prior_shape(m))
        for row in self.p:
            row.append(0.0)
        self.p.append([0.0] * len(self.x))
        self.p[-1][-1] = SHAPE_VAR

    def _update(self, m: int, y: float) -> None:
        n, p = len(self.x), self.p
        at = [0] + ([1 + self.sizes.index(m)] if m > 1 else [])  # the time is the sum of these
        ph = [sum(p[i][a] for a in at) for i in range(n)]  # P H^T
        s = sum(ph[a] for a in at) + NOISE  # the variance of the predicted log time
        r = y - sum(self.x[a] for a in at)
        if r > OUTLIER * math.sqrt(s):
            if not self.slow:
                self.slow = True  # one much slower step is a hiccup: wait for a second to believe it
                return
            p[0][0] += r * r  # two in a row: the load changed, which the speed takes
            ph = [sum(p[i][a] for a in at) for i in range(n)]
            s = sum(ph[a] for a in at) + NOISE
        self.slow = False
        before = self.x[0]
        gain = [v / s for v in ph]
        for i in range(n):
            self.x[i] += gain[i] * r
            for j in range(n):
                p[i][j] -= gain[i] * ph[j]
        moved = (self.x[0] - before) ** 2
        self.drift = DRIFT_MEMORY * self.drift + (1 - DRIFT_MEMORY) * max(SPEED_DRIFT, moved)

    def shape(self, m: int) -> float | None:
        """The estimated log v(m) of a timed size (None for one never timed)."""
        if m <= 1:
            return 0.0
        return self.x[1 + self.sizes.index(m)] if m in self.sizes else None

    def spread(self, m: int) -> float:
        """The standard deviation of log v(m): how unsure the ratio to a plain step is."""
        if m <= 1:
            return 0.0
        if m not in self.sizes:
            return math.sqrt(SHAPE_VAR)
        i = 1 + self.sizes.index(m)
        return math.sqrt(max(0.0, self.p[i][i]))

    def ratios(self, top: int) -> list[float]:
        """v(m) for m = 0..top (index 0 unused): timed sizes from their estimates, sizes
        between them interpolated, sizes beyond them extended along the prior's shape; then
        at least 1 and never above a larger size's (more tokens do not cost less)."""
        timed = {1: 0.0} | {m: self.shape(m) for m in self.sizes if m <= top}
        known = sorted(timed)
        logs = [0.0] * (top + 1)
        for m in range(1, top + 1):
            lower = max(x for x in known if x <= m)
            upper = [x for x in known if x >= m]
            if upper:
                b = upper[0]
                w = 0.0 if b == lower else (m - lower) / (b - lower)
                logs[m] = timed[lower] * (1 - w) + timed[b] * w
            else:
                logs[m] = timed[lower] + prior_shape(m) - prior_shape(lower)
        v, floor = [1.0] * (top + 1), math.inf
        for m in range(top, 0, -1):  # suffix minimum
            floor = min(floor, math.exp(max(0.0, logs[m])))
            v[m] = floor
        return v
