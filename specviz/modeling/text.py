"""Token ids and text: a prompt or a conversation to ids, ids to text, and each token's display text.

Each takes `loaded`, a models.Loaded (encode_chat: its tokenizer), left unannotated so that this
file needs nothing of models.py, which names these functions too: the app and the CLI hand the
models module around as their loader, text included.
"""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.errors import SpecvizError
from .chat import chat_messages


def check_same_vocab(target, drafter) -> None:
    """Speculative decoding compares token ids: both models must share one vocabulary."""
    if target.tokenizer is drafter.tokenizer:
        return
    a, b = target.tokenizer.get_vocab(), drafter.tokenizer.get_vocab()
    if a == b:
        return
    only_a = sorted(set(a) - set(b))[:3]
    only_b = sorted(set(b) - set(a))[:3]
    moved = sorted(t for t in set(a) & set(b) if a[t] != b[t])[:3]
    detail = (f"{len(a)} vs {len(b)} tokens; only in the target: {only_a}, only in the "
              f"drafter: {only_b}, different ids: {moved}")
    raise SpecvizError(
        f"target {target.name!r} and drafter {drafter.name!r} do not share a tokenizer "
        f"({detail}); pick a drafter from the same model family"
    )


def encode_prompt(loaded, prompt: str, chat: bool | None = None) -> list[int]:
    """Token ids for `prompt`, wrapped as one user turn in the chat template when there is one."""
    if not prompt or not prompt.strip():
        raise SpecvizError("the prompt is empty")
    tokenizer = loaded.tokenizer
    if chat is None:
        chat = loaded.is_chat
    if not chat:
        return list(tokenizer(prompt)["input_ids"])
    if not loaded.is_chat:
        raise SpecvizError(f"{loaded.name!r} has no chat template: turn chat formatting off")
    return encode_chat(tokenizer, chat_messages([("user", prompt)]))


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation ({"role", "content"} dicts) in the tokenizer's chat
    template, with the assistant's turn opened for the model to write."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # The template already writes every special token the model expects.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def decode(loaded, ids: Iterable[int]) -> str:
    """Text of `ids`, special tokens included, spaces exactly as the tokens carry them."""
    return loaded.tokenizer.decode(_as_list(ids), skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)


def token_strings(loaded, ids: Iterable[int]) -> list[str]:
    """Display text of each token: "".join(result) is decode(loaded, ids) without a last
    character the ids leave unfinished.

    Decoding a token alone goes wrong in two ways: SentencePiece drops a word's leading
    space at the start of a decode, and byte-level BPE splits one character's UTF-8 bytes
    over several tokens. detok.Detokenizer handles both: a token that ends mid-character
    shows as "" and the token that completes the character shows all of it.
    """
    from .detok import Detokenizer

    return Detokenizer(lambda part: decode(loaded, part), tokenizer=loaded.tokenizer).pieces(_as_list(ids))


def _as_list(ids) -> list[int]:
    if isinstance(ids, torch.Tensor):
        return ids.reshape(-1).tolist()
    return [int(i) for i in ids]
