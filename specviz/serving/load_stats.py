"""The load sweep's arithmetic, as pure functions: percentiles, one arm's numbers at one
concurrency, where speculation stops paying, and what a "speculate below C" policy gains.

Throughput is the server's total: tokens of every request at a level / the level's wall time
(first send to last finish), so it falls when requests wait on each other, as it should.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .records import ServerRun, SpecStats


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between the closest ranks, like
    numpy's default: position (n - 1) * q / 100 in the sorted values. None for no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in 0..100, got {q}")
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class ArmStats:
    """One arm (speculative or baseline) at one concurrency."""

    arm: str
    concurrency: int
    requests: int  # sent (finished or failed)
    failed: int
    tokens: int  # every request's tokens, a failed one's too: the server did produce them
    wall_s: float
    tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_s: float | None  # inter-token latency: each request's mean (vLLM's TPOT), then the percentile
    itl_p95_s: float | None
    acceptance_rate: float | None = None  # alpha; None for the baseline arm or a server that says nothing
    mean_accepted_length: float | None = None  # tau, tokens per verify step
    per_position_acceptance: tuple[float, ...] = ()
    acceptance_source: str | None = None  # "metrics" (server-wide /metrics delta) or "requests" (per-request sums)
    partial: bool = False  # cut short by max_minutes: fewer requests than asked

    def to_dict(self) -> dict:
        d = asdict(self)
        d["per_position_acceptance"] = list(self.per_position_acceptance)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ArmStats":
        return cls(**{**d, "per_position_acceptance": tuple(d.get("per_position_acceptance") or ())})


def pooled_spec(runs: list[ServerRun]) -> SpecStats | None:
    """The requests' own spec fields added up, as one SpecStats (its rates are then the pooled
    rates: total accepted / total drafted, not a mean of per-request rates)."""
    specs = [r.spec for r in runs if r.spec is not None]
    if not specs:
        return None
    steps = [s.steps for s in specs]
    detailed = all(s.per_step_accepted is not None and s.per_step_drafted is not None for s in specs)
    return SpecStats(
        engine=specs[0].engine,
        drafted=sum(s.drafted for s in specs),
        accepted=sum(s.accepted for s in specs),
        steps=sum(steps) if None not in steps else None,
        per_step_accepted=tuple(a for s in specs for a in s.per_step_accepted) if detailed else None,
        per_step_drafted=tuple(d for s in specs for d in s.per_step_drafted) if detailed else None,
    )


def summarize(arm: str, concurrency: int, runs: list[ServerRun], wall_s: float, counters=None,
              partial: bool = False) -> ArmStats:
    """One arm's numbers at one level. counters: the server's /metrics change over the level
    (a SpecCounters delta), preferred to the requests' own fields because it counts every
    verify step the server ran, also those of requests that failed."""
    tokens = sum(r.tokens for r in runs)
    alpha = tau = None
    positions: tuple[float, ...] = ()
    source = None
    if counters is not None and counters.draft_tokens:
        alpha, tau = counters.acceptance_rate, counters.mean_accepted_length
        positions, source = tuple(counters.per_position_acceptance), "metrics"
    elif (pooled := pooled_spec(runs)) is not None and pooled.drafted:
        alpha, tau = pooled.acceptance_rate, pooled.mean_accepted_length
        positions, source = tuple(pooled.per_position_acceptance), "requests"
    ttft = [r.ttft_s for r in runs if r.error is None]
    itl = [r.inter_token_s for r in runs if r.error is None]
    return ArmStats(
        arm=arm, concurrency=concurrency, requests=len(runs), failed=sum(r.error is not None for r in runs),
        tokens=tokens, wall_s=wall_s, tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        ttft_p50_s=percentile(ttft, 50), ttft_p95_s=percentile(ttft, 95),
        itl_p50_s=percentile(itl, 50), itl_p95_s=percentile(itl, 95),
        acceptance_rate=alpha, mean_accepted_length=tau, per_position_acceptance=positions,
        acceptance_source=source, partial=partial,
    )


def speedups(levels: list[tuple[int, float, float]]) -> list[tuple[int, float]]:
    """(concurrency, speculative tokens/s / baseline tokens/s) for the levels where both arms
    produced tokens. levels: (concurrency, speculative tokens/s, baseline tokens/s), ascending."""
    return [(c, spec / base) for c, spec, base in levels if base > 0 and spec > 0]


@dataclass(frozen=True)
class Crossover:
    """Where speculative / baseline throughput first falls below 1 as concurrency grows."""

    concurrency: float | None  # None: it does not cross within the sweep (see reason)
    below: int | None  # the measured levels that bracket it
    above: int | None
    reason: str
    crossings: int = 0  # how often the ratio crosses 1 either way: more than one means noise or a bump

    def to_dict(self) -> dict:
        return asdict(self)


def crossover(levels: list[tuple[int, float, float]]) -> Crossover:
    """The first concurrency where speculation stops paying, interpolated log-linearly: the
    ratio is taken as linear in log(concurrency) between the two measured levels that bracket
    the crossing, because the levels are spaced by factors (1, 2, 4 ...), not steps."""
    ratios = speedups(levels)
    if not ratios:
        return Crossover(None, None, None, "no level where both arms produced tokens")
    pays = [r >= 1 for _, r in ratios]
    crossings = sum(a != b for a, b in zip(pays, pays[1:]))
    for (c0, r0), (c1, r1) in zip(ratios, ratios[1:]):
        if r0 >= 1 > r1:
            t = (r0 - 1) / (r0 - r1)  # 0 when r0 is exactly 1: the crossing is at c0 itself
            at = math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0)))
            return Crossover(at, c0, c1, f"speculative/baseline throughput falls from {r0:.2f} at concurrency "
                             f"{c0} to {r1:.2f} at {c1}: it crosses 1 near {at:.1f} (log-linear)", crossings)
    if all(pays):
        return Crossover(None, None, None, f"speculation paid at every level measured (up to concurrency "
                         f"{ratios[-1][0]}, ratio {ratios[-1][1]:.2f} there)", crossings)
    if len(ratios) == 1:
        return Crossover(None, None, None, f"only concurrency {ratios[0][0]} measured, where speculation did not "
                         f"pay (ratio {ratios[0][1]:.2f})", crossings)
    return Crossover(None, None, None, f"speculation did not pay at the lowest level measured (concurrency "
                     f"{ratios[0][0]}, ratio {ratios[0][1]:.2f}) and never crossed back down", crossings)


def policy_threshold(levels: list[tuple[int, float, float]], cross: Crossover) -> int | None:
    """C for "speculate below concurrency C": the first measured level at or above the crossover
    (any C between the bracketing levels gives the same choices at the measured ones; a tie
    at exactly 1 goes to no speculation, which holds less memory). None: always speculate."""
    measured = [c for c, _ in speedups(levels)]
    if not measured:
        return None
    if cross.concurrency is not None:
        return min(c for c in measured if c >= cross.concurrency - 1e-9)
    ratios = dict(speedups(levels))
    return None if ratios[measured[0]] >= 1 else measured[0]  # paid everywhere, or lost from the start


def toggle_policy(levels: list[tuple[int, float, float]], threshold: int | None) -> dict:
    """Throughput under "speculate below C" at each level and its gain over always-on and
    always-off. The aggregate weights each measured level equally in time (the server spends
    as long at each concurrency), so it is the mean of the levels' tokens/s."""
    rows = []
    for c, spec, base in levels:
        if spec <= 0 or base <= 0:
            continue
        speculate = threshold is None or c < threshold
        chosen = spec if speculate else base
        rows.append({"concurrency": c, "speculate": speculate, "tokens_per_s": chosen,
                     "always_on_tokens_per_s": spec, "always_off_tokens_per_s": base,
                     "gain_over_always_on": chosen / spec - 1, "gain_over_always_off": chosen / base - 1})
    if not rows:
        return {"threshold": threshold, "rule": "no level where both arms produced tokens", "levels": [],
                "weighting": None, "mean_tokens_per_s": None, "gain_over_always_on": None,
                "gain_over_always_off": None}
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    policy, on, off = mean("tokens_per_s"), mean("always_on_tokens_per_s"), mean("always_off_tokens_per_s")
    rule = "speculate at every level measured" if threshold is None else f"speculate below concurrency {threshold}"
    return {"threshold": threshold, "rule": rule, "levels": rows,
            "weighting": "each measured level weighted equally (equal time at each concurrency): "
                         "the mean of the levels' total tokens/s",
            "mean_tokens_per_s": policy, "always_on_mean_tokens_per_s": on, "always_off_mean_tokens_per_s": off,
            "gain_over_always_on": policy / on - 1, "gain_over_always_off": policy / off - 1}
