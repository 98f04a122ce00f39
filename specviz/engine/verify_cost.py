"""Why checking is cheap: what one target pass over m tokens costs on this machine.

Speculative decoding rests on one fact of the hardware: a decode step reads every weight
once, whatever the number of tokens it carries, so while memory bandwidth (not arithmetic)
bounds it, verifying k + 1 tokens in one pass costs about what producing one does. How far
a machine is from that ideal is its verify-cost curve: T(m), the seconds of one target
forward over m new tokens, for m = 1, 2, 4, ..., 32. A GPU stays flat to ~16 tokens and
more; a CPU climbs (5 tokens at 1.3-1.7x one token on the project's machine), which is
why speedups on a CPU are smaller than the 2-3x reported on GPUs.

The curve is measured once per model, device and dtype (timing.forward_costs, on a
fixed short context) and kept in memory for as long as the model lives; callers measure
it outside any timed run (after warm-up), since it takes the machine for a second or two.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from ..modeling.forward import context_length, model_device, output_vocab_size
from ..modeling.models import weight_bytes
from .timing import forward_costs

SIZES = (1, 2, 4, 8, 16, 32)  # tokens in one pass: 1 is plain decoding, the rest verify k + 1 of them
CONTEXT = 64  # tokens already in the cache when timed: a short prompt's worth, as in a real run
REPEATS = 3  # timed forwards per size; the median is kept


@dataclass(frozen=True)
class VerifyCurve:
    """T(m) measured: seconds of one target forward over each of `sizes` new tokens."""

    sizes: tuple[int, ...]  # ascending, starting at 1
    seconds: tuple[float, ...]  # median seconds of one forward over sizes[i] tokens
    weight_bytes: int  # bytes of the weights: what every pass must read at least once
    device: str = ""
    dtype: str = ""

    @property
    def relative(self) -> tuple[float, ...]:
        """v(m) = T(m) / T(1) at each measured size: 1 is the ideal (verifying is free)."""
        return tuple(t / self.seconds[0] for t in self.seconds)

    @property
    def bandwidth(self) -> float:
        """Bytes per second a one-token step reads if it reads the weights once (the implied
        memory bandwidth): how close plain decoding runs to this machine's memory speed."""
        return self.weight_bytes / self.seconds[0] if self.seconds[0] > 0 else 0.0

    def cost(self, m: float) -> float:
        """v(m): a pass over m tokens in units of a one-token pass, interpolated linearly
        between measured sizes (m may be a mean draft length + 1) and continued along the
        last measured segment beyond them."""
        v, sizes = self.relative, self.sizes
        if m <= sizes[0] or len(sizes) == 1:
            return v[0]
        i = next((i for i in range(1, len(sizes)) if m <= sizes[i]), len(sizes) - 1)
        a, b = sizes[i - 1], sizes[i]
        return v[i - 1] + (v[i] - v[i - 1]) * (m - a) / (b - a)

    def to_dict(self) -> dict:
        return {"sizes": list(self.sizes), "seconds": list(self.seconds), "relative": list(self.relative),
                "weight_bytes": self.weight_bytes, "bandwidth_bytes_per_s": self.bandwidth,
                "device": self.device, "dtype": self.dtype}


def measure(model, sizes=SIZES, repeats: int = REPEATS, costs=forward_costs) -> VerifyCurve:
    """Time one forward over each size on a fixed context of CONTEXT tokens (fewer, and only
    the sizes that fit, for a model with a short context). Costs ~1-3 s on the embedded model."""
    limit = context_length(model) or 1 << 20
    context = max(1, min(CONTEXT, limit // 2))
    sizes = tuple(n for n in sorted(set(sizes) | {1}) if context + n <= limit)
    vocab = output_vocab_size(model)
    prompt = [(7 * i + 3) % vocab for i in range(context)]  # any ids: time does not depend on them
    seconds = costs(model, prompt, sizes, repeats)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return VerifyCurve(sizes, tuple(seconds[n] for n in sizes), weight_bytes(model),
                       str(model_device(model)), dtype)


# One curve per live model, by device and dtype; a model dropped from the models' cache takes
# its curves with it. Shared by every visitor: a curve is a fact of the model and the machine.
_CURVES: "weakref.WeakKeyDictionary[object, dict[tuple, VerifyCurve]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _key(model) -> tuple[str, str]:
    return str(model_device(model)), str(next(model.parameters()).dtype)


def known(model) -> VerifyCurve | None:
    """The model's curve if it was measured already (never measures)."""
    with _LOCK:
        return _CURVES.get(model, {}).get(_key(model))


def curve(model, measure=measure) -> VerifyCurve:
    """The model's curve, measured on first use. One measurement at a time: a second caller
    waits for it rather than timing the model while another measurement runs."""
    with _LOCK:
        found = _CURVES.get(model, {}).get(_key(model))
        if found is None:
            found = measure(model)
            _CURVES.setdefault(model, {})[_key(model)] = found
    return found
