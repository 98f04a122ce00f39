"""A conversation as chat messages: the one shape chat templates and chat servers read.

specviz keeps a conversation as (role, text) pairs (a bench suite's turns, a load prompt);
a tokenizer's chat template (text.encode_chat) and a server's /v1/chat/completions both
want [{"role": ..., "content": ...}, ...]. It imports nothing of specviz, so the torch-free
serving client and the models layer can both use it.
"""
from __future__ import annotations

from collections.abc import Iterable


def chat_messages(turns: Iterable[tuple[str, str]]) -> list[dict]:
    """[{"role", "content"}, ...] of (role, text) pairs; one user turn is [("user", text)]."""
    return [{"role": role, "content": text} for role, text in turns]
