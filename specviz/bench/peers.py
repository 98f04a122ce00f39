"""transformers' own generate(), run on the same target, prompts and settings as specviz.

    hf           plain generate (greedy or sampling): transformers' baseline
    hf-pld       generate(prompt_lookup_num_tokens=k, max_matching_ngram_size=3)
    hf-assisted  generate(assistant_model=<the draft model>) with num_assistant_tokens=k

Fixed-k arms pin transformers' draft length ("constant" schedule, no confidence cut-off),
so both libraries draft the same number of tokens; dynamic arms use its "heuristic"
schedule (+2 after a full accept, -1 otherwise), the rule specviz's dynamic k copies.
EOS ends the output; min_new_tokens is left unset.
"""
from __future__ import annotations

import time
import warnings

import torch

from ..core.sampling import Sampling
from ..modeling.forward import model_device, synchronize

PEERS = ("hf", "hf-pld", "hf-assisted")


def generate_kwargs(peer: str, k: int | None, dynamic: bool, sampling: Sampling, max_new_tokens: int,
                    eos: tuple[int, ...], assistant=None) -> dict:
    kw = dict(max_new_tokens=max_new_tokens, eos_token_id=list(eos) or None,
              pad_token_id=eos[0] if eos else 0)
    if sampling.greedy:
        kw.update(do_sample=False)
    else:
        # top_k 0 is off in both libraries; None would leave the model's own default in force (often 50),
        # and the peer would sample another distribution than specviz's arm beside it.
        kw.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    if sampling.repetition_penalty != 1.0:
        kw["repetition_penalty"] = sampling.repetition_penalty
    if peer == "hf-pld":
        kw.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=3)
    elif peer == "hf-assisted":
        gc = assistant.generation_config
        gc.num_assistant_tokens = k
        gc.num_assistant_tokens_schedule = "heuristic_transient" if dynamic else "constant"
        gc.assistant_confidence_threshold = 0.0
        kw["assistant_model"] = assistant
    return kw


def run_peer(target, prompt_ids: list[int], kwargs: dict, seed: int) -> tuple[list[int], float]:
    """(generated token ids, wall seconds) of one generate() call."""
    device = model_device(target)
    ids = torch.tensor([prompt_ids], device=device)
    torch.manual_seed(seed)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # generate() warns about flags it sets itself
        synchronize(device)
        t0 = time.perf_counter()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        synchronize(device)
        seconds = time.perf_counter() - t0
    return out[0, len(prompt_ids):].tolist(), seconds
