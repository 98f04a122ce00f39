"""Prompt suites: JSONL files, one prompt per line.

Each line is an object with
    id        unique name (string)
    category  e.g. chat, translation, summarization, qa, math, rag, code
    prompt    the user message (string), or
    turns     a conversation [{"role": "user"|"assistant"|"system", "content": ...}, ...]
              ending with a user turn; the model writes the next assistant turn
    chat      optional bool (default true): wrap in the tokenizer's chat template;
              false feeds `prompt` as raw text (for base models)
    series    optional name: requests of one user in the suite's order (the "repeated" category:
              the same function edited again, a form letter for several people, a question
              re-asked). A drafter with memory across requests (suffix decoding) carries it
              from one request of a series to the next; without a series, across its category's
              prompts. The first request of each runs cold, the later ones warm.

Built-in suites live in assets/bench/<name>.jsonl; anything else is read as a path.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from ..core.errors import SpecvizError
from ..modeling.chat import chat_messages
from ..modeling.text import encode_chat

ASSETS = pathlib.Path(__file__).resolve().parents[2] / "assets" / "bench"
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    messages: tuple[tuple[str, str], ...]  # (role, content); a plain prompt is one user turn
    chat: bool = True
    series: str = ""  # requests that share a memory across requests; "" = the category's

    @property
    def memory_scope(self) -> str:
        """Which prompts' earlier answers a memory across requests holds when this one runs."""
        return f"series:{self.series}" if self.series else f"category:{self.category}"

    @property
    def text(self) -> str:
        """The last user message (what a one-line preview shows)."""
        return self.messages[-1][1]


def builtin_suites() -> list[str]:
    return sorted(p.stem for p in ASSETS.glob("*.jsonl"))


def suite_path(suite: str) -> pathlib.Path:
    """A built-in suite's file, or `suite` itself as a path."""
    builtin = ASSETS / f"{suite}.jsonl"
    if "/" not in suite and not suite.endswith(".jsonl") and builtin.is_file():
        return builtin
    path = pathlib.Path(suite).expanduser()
    if not path.is_file():
        raise SpecvizError(
            f"no prompt suite {suite!r}: give a built-in name ({', '.join(builtin_suites())}) "
            "or the path of a JSONL file"
        )
    return path


def load_suite(suite: str) -> list[BenchPrompt]:
    path = suite_path(suite)
    prompts, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise SpecvizError(f"{where}: not valid JSON ({e.msg})") from None
            prompt = parse_item(item, where)
            if prompt.id in seen:
                raise SpecvizError(f"{where}: id {prompt.id!r} appears twice")
            seen.add(prompt.id)
            prompts.append(prompt)
    if not prompts:
        raise SpecvizError(f"{path} holds no prompts")
    return prompts


def parse_item(item, where: str) -> BenchPrompt:
    if not isinstance(item, dict):
        raise SpecvizError(f"{where}: expected a JSON object, got {type(item).__name__}")
    for key in ("id", "category"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise SpecvizError(f"{where}: {key!r} must be a non-empty string")
    chat = item.get("chat", True)
    if not isinstance(chat, bool):
        raise SpecvizError(f"{where}: 'chat' must be true or false")
    series = item.get("series", "")
    if not isinstance(series, str):
        raise SpecvizError(f"{where}: 'series' must be a string (the name of a run of related requests)")
    has_prompt, has_turns = "prompt" in item, "turns" in item
    if has_prompt == has_turns:
        raise SpecvizError(f"{where}: give exactly one of 'prompt' (a string) or 'turns' (a list)")
    if has_prompt:
        if not isinstance(item["prompt"], str) or not item["prompt"].strip():
            raise SpecvizError(f"{where}: 'prompt' must be a non-empty string")
        messages = (("user", item["prompt"]),)
    else:
        messages = parse_turns(item["turns"], where)
        if not chat:
            raise SpecvizError(f"{where}: 'turns' need the chat template; drop \"chat\": false")
    return BenchPrompt(item["id"], item["category"], messages, chat, series.strip())


def parse_turns(turns, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(turns, list) or not turns:
        raise SpecvizError(f"{where}: 'turns' must be a non-empty list of {{role, content}} objects")
    messages = []
    for i, turn in enumerate(turns):
        ok = isinstance(turn, dict) and turn.get("role") in ROLES and isinstance(turn.get("content"), str)
        if not ok:
            raise SpecvizError(f"{where}: turn {i} must be {{\"role\": one of {ROLES}, \"content\": a string}}")
        messages.append((turn["role"], turn["content"]))
    if messages[-1][0] != "user":
        raise SpecvizError(f"{where}: the last turn must be the user's (the model answers it)")
    return tuple(messages)


def select(prompts: list[BenchPrompt], categories: list[str] | None = None,
           limit: int | None = None) -> list[BenchPrompt]:
    """Keep the given categories (all by default) and at most `limit` prompts of each."""
    known = sorted({p.category for p in prompts})
    if categories:
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise SpecvizError(f"no category {', '.join(unknown)} in this suite; it has {', '.join(known)}")
    chosen, per_category = [], {}
    for p in prompts:
        if categories and p.category not in categories:
            continue
        if limit is not None and per_category.get(p.category, 0) >= limit:
            continue
        per_category[p.category] = per_category.get(p.category, 0) + 1
        chosen.append(p)
    return chosen


def encode(tokenizer, prompt: BenchPrompt) -> list[int]:
    """Token ids of a prompt: the chat template with the assistant turn opened, or raw text."""
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        return encode_chat(tokenizer, chat_messages(prompt.messages))
    if prompt.chat and len(prompt.messages) > 1:
        raise SpecvizError(f"prompt {prompt.id!r} is a conversation, but this tokenizer has no chat template")
    return list(tokenizer(prompt.text).input_ids)
