"""The one interface every drafter implements.

A drafter is told the run is starting (`begin`), is asked for up to k tokens after the
current context (`propose`), and is told how many of them the target kept (`feedback`),
so it can roll back its own state. The verifier never asks what kind of drafter it is.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor  # (k,) long, on the target's device
    q: torch.Tensor | None  # (k, vocab) processed drafter probabilities; None = deterministic


class Drafter:
    name = "drafter"

    def begin(self, prompt_ids: list[int], processor, generator: torch.Generator, device) -> None:
        """A new run starts with this prompt; reset any state."""

    def propose(self, ids: list[int], k: int, min_confidence: float = 0.0) -> Draft:
        """Up to k tokens to follow `ids` (prompt and generated text so far)."""
        raise NotImplementedError

    def feedback(self, accepted: int) -> None:
        """The target kept the first `accepted` tokens of the last draft."""


def empty_draft(device) -> Draft:
    return Draft(torch.empty(0, dtype=torch.long, device=device), None)
