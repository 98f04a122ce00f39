"""How a drafter is trained (TrainConfig) and how far a run has got (Progress, what a checkpoint holds).

Apart from the loop so that the model card (card.py) can describe both without importing the loop.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..core.errors import SpecvizError


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000  # optimiser steps in the whole schedule
    epochs: float | None = None  # when set: passes over the training sequences, which fix `steps`
    lr: float = 1e-3  # peak learning rate: linear warm-up, then cosine decay to a tenth
    batch: int = 8  # sequences per step
    seed: int = 0  # decides the initial weights and every step's batch
    window: int = 384  # longer sequences are cropped to a window at a seeded offset
    checkpoint_every: int = 100  # steps between checkpoints (one is also written at the end)
    held_out: int = 20  # prompts kept out of training for the held-out loss and acceptance
    eval_prompts: int | None = None  # held-out prompts run through the engine (None: all of them)
    eval_k: int = 4  # draft length of that run
    eval_tokens: int = 64  # new tokens per held-out prompt
    max_seconds: float | None = None  # time cap: then the drafter is evaluated and saved as it is
    # bf16 autocast for the forward passes (fp32 weights and optimiser): faster on a CPU with native
    # bf16, AMX or AVX512-BF16 (docs/performance.md; train/measure.py measures it).
    autocast: bool = False
    # With an init file: the saved weights are (1 - w) * trained + w * init ("model soups" /
    # WiSE-FT). A fine-tune on a narrow new slice forgets some of what the init knew; the mean of
    # the two kept it (EAGLE's sixteenth run: bench tau 2.16 for the fine-tune, 2.20 for the mean).
    average_init: float = 0.0

    @property
    def warmup(self) -> int:
        return max(1, min(50, self.steps // 10))

    def check(self) -> "TrainConfig":
        check_positive(steps=self.steps, batch=self.batch, checkpoint_every=self.checkpoint_every,
                       window=self.window)
        if not 0 < self.lr < 1:
            raise SpecvizError(f"learning rate must be in (0, 1), got {self.lr}")
        if self.epochs is not None and not self.epochs > 0:
            raise SpecvizError(f"epochs must be positive, got {self.epochs}")
        if not 0 <= self.average_init < 1:
            raise SpecvizError(f"the init's share of the averaged weights must be in [0, 1), got {self.average_init}")
        return self

    def for_data(self, sequences: int) -> "TrainConfig":
        """This config with `steps` set by `epochs` over that many training sequences."""
        if self.epochs is None:
            return self
        return dataclasses.replace(self, steps=max(1, math.ceil(self.epochs * sequences / self.batch)))


@dataclass
class Progress:
    """What a checkpoint holds besides the weights and the optimiser state."""

    step: int = 0  # steps done
    history: list[float] = field(default_factory=list)  # each step's loss
    seconds: float = 0.0  # training time of the calls before this one


def check_positive(**values) -> None:
    """SpecvizError unless every value is an int >= 1."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecvizError(f"{name.replace('_', ' ')} must be a positive integer, got {v}")
