"""Prompts for self-distillation: the written set plus sources made offline, at scale.

    written  assets/train/prompts.jsonl, 518 prompts written for this project
    self     user turns the target writes itself, given only its chat template's user
             header (sampled, then filtered: complete, long enough, language-like, no
             template tokens, not a loop, deduplicated)
    code     code-editing tasks over functions and classes of Python's standard library
             (picked with `ast`; type hints, renames, docstrings, rewrites, tests, ...)
    docs     summarising and rewriting tasks over documentation text on the machine:
             stdlib docstrings, and /usr/share/doc text files where they exist

Every source is deterministic given its seed (and, for `self`, the target), labels each
row with its source, and names it by a hash of its text, so a prompt keeps its id however
the pool around it changes. No prompt shares text with a benchmark suite: a prompt that
repeats a bench prompt, or any run of 8 words of one, is dropped.
"""
from __future__ import annotations

import functools
import hashlib
import json
import pathlib
import re

from ..core.errors import SpecvizError
from ..modeling.chat import chat_messages
from .tasks import code_tasks, doc_tasks

PROMPTS = pathlib.Path(__file__).resolve().parents[2] / "assets" / "train" / "prompts.jsonl"
SOURCES = ("written", "self", "code", "docs")
GRAM = 8  # words in a run that may not repeat a bench prompt's


def read_prompts(path: str | pathlib.Path = PROMPTS) -> list[dict]:
    """The prompt set: JSON lines with "id" and "prompt" (and "category", "source")."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise SpecvizError(f"prompt file {path} not found")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecvizError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise SpecvizError(f"{path}:{n}: each line needs a non-empty \"prompt\" string")
        row.setdefault("id", f"line-{n}")
        row.setdefault("source", "written")
        rows.append(row)
    if not rows:
        raise SpecvizError(f"prompt file {path} holds no prompts")
    return rows


def row(source: str, category: str, prompt: str) -> dict:
    return {"id": f"{source}-{hashlib.sha1(prompt.encode()).hexdigest()[:12]}", "source": source,
            "category": category, "prompt": prompt}


SELF_BATCH = 32  # user turns drawn per round (self_written); a round is a seed


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def grams(text: str, n: int = GRAM) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


@functools.lru_cache(maxsize=1)
def bench_text() -> tuple[frozenset, frozenset]:
    """(every 8-word run, every whole message) of every built-in bench suite, lower-cased."""
    from ..run.suites import builtin_suites, load_suite

    texts = [content for s in builtin_suites() for p in load_suite(s) for _, content in p.messages]
    return frozenset().union(*(grams(t) for t in texts)), frozenset(t.strip().lower() for t in texts)


def shares_bench_text(prompt: str) -> bool:
    runs, whole = bench_text()
    return prompt.strip().lower() in whole or bool(grams(prompt) & runs)


def user_header(tokenizer) -> str:
    """The chat template's text up to where a user's message would begin."""
    mark = "\u2063specviz-user\u2063"
    text = tokenizer.apply_chat_template(chat_messages([("user", mark)]), tokenize=False)
    return text[:text.index(mark)]


def user_turn_ok(text: str, specials=()) -> bool:
    """Whether a target-written user turn is worth answering: long enough, mostly letters,
    no template tokens, not a loop."""
    text = text.strip()
    w = words(text)
    if not 20 <= len(text) <= 1500 or len(w) < 4:
        return False
    if any(s and s in text for s in (*specials, "<|", "|>")):
        return False
    letters = sum(c.isascii() and c.isalpha() for c in text)
    plain = sum(c.isalnum() or c.isspace() or c in ".,;:!?'\"()-" for c in text)
    return letters >= 0.6 * len(text.replace(" ", "")) and plain >= 0.9 * len(text) and len(set(w)) >= 0.5 * len(w)


def self_written(target_loaded, n: int, seed: int = 0, *, batch: int = SELF_BATCH, max_new_tokens: int = 96,
                 model=None, keep=None, progress: bool = True, resume: tuple[list[dict], int] | None = None,
                 rounds: list | None = None) -> list[dict]:
    """Up to `n` distinct user turns the target writes after its user header, sampled at T = 1.

    model: what generates (default the target's own model, e.g. pass a bf16 copy);
    keep: the filter (default user_turn_ok). Gives up after 4x the draws `n` needs.
    resume: (rows, round) from a shorter call with the same settings, which stopped in that
    round: the draws go on from there and give what one call for `n` gives. rounds: a list
    that gets the round this call stopped in (for a later resume)."""
    import torch
    from tqdm.auto import tqdm

    from .generate import generate

    tok = target_loaded.tokenizer
    header = tok(user_header(tok), add_special_tokens=False)["input_ids"]
    eos = list(target_loaded.eos_token_ids)
    pad = target_loaded.pad_token_id
    specials = tuple(tok.all_special_tokens)
    keep = keep or (lambda text: user_turn_ok(text, specials))
    out, first = (list(resume[0]), resume[1]) if resume else ([], 0)
    # Rows kept before count as seen: redrawing their round skips them and goes on after them.
    seen = {" ".join(words(r["prompt"])) for r in out}
    bar = tqdm(total=n, initial=min(len(out), n), desc="self-written prompts", unit="prompt", disable=not progress)
    stopped = first  # the last round drawn: a later call for more resumes there
    # Give up after 4x the rounds the prompts still wanted need (the same bound as one call for n,
    # unless a resume starts late).
    last = max(4 * -(-n // batch), first + 4 * -(-(n - len(out)) // batch))
    for round_no in range(first, last):
        if len(out) >= n:
            break
        stopped = round_no
        gen = torch.Generator().manual_seed(seed * 1_000_003 + round_no)
        for ids in generate(model or target_loaded.model, [header] * batch, max_new_tokens, eos, pad,
                            temperature=1.0, generator=gen):
            if not ids or ids[-1] not in eos:  # cut off by the length cap: not a whole turn
                continue
            text = tok.decode(ids[:-1], skip_special_tokens=False).strip()
            key = " ".join(words(text))
            if key in seen or not keep(text) or shares_bench_text(text):
                continue
            seen.add(key)
            out.append(row("self", "chat", text))
            bar.update(1)
            if len(out) >= n:
                break
    bar.close()
    if rounds is not None:
        rounds.append(stopped)
    return out[:n]


def gather(sources: dict[str, int], seed: int = 0, *, target_loaded=None, cache: pathlib.Path | None = None,
           written: str | pathlib.Path = PROMPTS, **self_kwargs) -> list[dict]:
    """The prompt pool: {source: how many} (the written set is always whole), deduplicated.

    cache: a folder where the `self` rows are kept (prompts-self.jsonl), so a resumed
    build does not write them again."""
    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise SpecvizError(f"unknown prompt source(s) {sorted(unknown)}: choose from {', '.join(SOURCES)}")
    pool = []
    if "written" in sources:
        pool += read_prompts(written)
    if sources.get("self"):
        if target_loaded is None:
            raise SpecvizError("the 'self' prompt source needs the target to write them")
        pool += _cached_self(target_loaded, sources["self"], seed, cache, **self_kwargs)
    if sources.get("code"):
        pool += [r for r in code_tasks(sources["code"], seed, row) if not shares_bench_text(r["prompt"])]
    if sources.get("docs"):
        pool += [r for r in doc_tasks(sources["docs"], seed, row) if not shares_bench_text(r["prompt"])]
    seen, out = set(), []
    for r in pool:
        key = r["prompt"].strip()
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _cached_self(target_loaded, n: int, seed: int, cache, **kwargs) -> list[dict]:
    """The `self` rows, kept in `cache`: a request for as many or fewer reads them; for more,
    the draws go on from the round the kept ones stopped in (the first line records it), so
    growing the pool writes only the new prompts, and the same ones a single call would."""
    path = pathlib.Path(cache) / "prompts-self.jsonl" if cache else None
    stamp = {"seed": seed, "target": target_loaded.name}
    resume = None
    if path and path.is_file():
        lines = path.read_text(encoding="utf-8").splitlines()
        old = json.loads(lines[0]) if lines else {}
        rows = [json.loads(x) for x in lines[1:]]
        same = {k: old.get(k) for k in stamp} == stamp
        if same and old.get("n", 0) >= n:  # same draws, at least as many asked for
            return rows[:n]
        if same and "round" in old:
            resume = (rows, old["round"])
        elif same and rows:
            # Kept before the stopping round was recorded: go on after every round that call could
            # have drawn (it gave up at 4x its rounds), so the kept prompts stay and only new ones
            # are drawn. Redrawing from round 0 would replace them when the writer has changed.
            resume = (rows, 4 * -(-old.get("n", len(rows)) // kwargs.get("batch", SELF_BATCH)))
    stopped: list = []
    rows = self_written(target_loaded, n, seed, resume=resume, rounds=stopped, **kwargs)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        head = {**stamp, "n": n, "round": stopped[0]}
        tmp.write_text("\n".join(json.dumps(x) for x in [head, *rows]) + "\n", encoding="utf-8")
        tmp.replace(path)
    return rows
