"""Training data by self-distillation: the target answers the project's own prompts.

Two passes per batch of prompts:
1. generate: the target writes a response to each prompt (batched, left padding; the
   first pass is greedy, later passes sample so the same prompt gives new text);
2. teacher-force: one forward over prompt + response records, after every token, the
   target's final hidden state (post norm: exactly its LM head's input) and its top-K
   next-token probabilities.
Prompt positions are kept too: teacher-forcing text is ~3x cheaper than generating it,
so the prompts themselves are extra distillation data for free.

On disk under `$SPECVIZ_CACHE/train/<target fingerprint[:12]>/`: `meta.json` (settings and
which (prompt, pass) pairs are done) and `shard-NNNNN.pt` files, each a list of sequences.
Building is resumable: a killed run keeps every finished shard and skips those prompts.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import SpecvizError

PROMPTS = pathlib.Path(__file__).resolve().parents[2] / "assets" / "train" / "prompts.jsonl"
TOP_K = 32  # how many of the target's next-token probabilities each position keeps
FORMAT = 1


@dataclass
class Seq:
    ids: torch.Tensor  # (T,) long: prompt (chat-formatted) then response
    response_start: int  # ids[response_start:] is what the target wrote
    hidden: torch.Tensor  # (T, H) half: target's final hidden after each token
    top_ids: torch.Tensor  # (T, K) long: target's top-K next tokens after each token
    top_p: torch.Tensor  # (T, K) half: their probabilities
    prompt_id: str = ""
    variant: str = "greedy"  # which pass wrote the response ("greedy", "sample1", ...)


@dataclass
class Corpus:
    sequences: list[Seq]
    meta: dict = field(default_factory=dict)

    def split(self, held_out: int) -> tuple["Corpus", "Corpus"]:
        """(train, held): `held_out` prompts chosen by a hash of their id, so the choice does
        not move when more data is added. Held prompts keep only their greedy response, and
        none of their responses is trained on."""
        keys = sorted({s.prompt_id for s in self.sequences}, key=_stable_hash)
        held_ids = set(keys[:held_out])
        train = [s for s in self.sequences if s.prompt_id not in held_ids]
        held = [s for s in self.sequences if s.prompt_id in held_ids and s.variant == "greedy"]
        held.sort(key=lambda s: _stable_hash(s.prompt_id))
        return Corpus(train, self.meta), Corpus(held, self.meta)

    def token_counts(self, vocab: int | None = None) -> torch.Tensor:
        """How often each token id occurs in the sequences (prompts and responses)."""
        vocab = vocab or int(self.meta.get("vocab", 0)) or 1 + max(int(s.ids.max()) for s in self.sequences)
        counts = torch.zeros(vocab, dtype=torch.long)
        for s in self.sequences:
            counts += torch.bincount(s.ids, minlength=vocab)[:vocab]
        return counts

    @property
    def tokens(self) -> int:
        return sum(len(s.ids) for s in self.sequences)

    @property
    def response_tokens(self) -> int:
        return sum(len(s.ids) - s.response_start for s in self.sequences)


def choose_subset(counts: torch.Tensor, size: int, always=(), unseen: bool = True) -> torch.Tensor:
    """The `size` most frequent token ids (by `counts`), plus `always` (e.g. EOS), sorted.

    Ties go to lower ids: BPE vocabularies number their tokens in merge order, so a low id
    is a rough prior for a common token. unseen=False leaves out tokens the data never
    showed, even if fewer than `size` remain."""
    if size < 1:
        raise SpecvizError(f"the token subset must hold at least one token, got {size}")
    n = counts.numel()
    if not unseen:
        size = min(size, max(1, int((counts > 0).sum())))
    score = counts.double() + 0.5 * (1 - torch.arange(n, dtype=torch.double) / n)  # the tie-break stays < 1
    top = torch.topk(score, min(size, n)).indices
    extra = torch.tensor([t for t in always if 0 <= t < n], dtype=torch.long)
    return torch.unique(torch.cat([top, extra]))  # sorted ascending


def _stable_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def data_dir(target_loaded) -> pathlib.Path:
    from ..drafters.trained import fingerprint
    from ..embedded import cache_dir

    return cache_dir() / "train" / fingerprint(target_loaded.model)[:12]


def read_prompts(path: str | pathlib.Path = PROMPTS) -> list[dict]:
    """The prompt set: JSON lines with "id" and "prompt" (and "category")."""
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
        rows.append(row)
    if not rows:
        raise SpecvizError(f"prompt file {path} holds no prompts")
    return rows


def load_data(target_loaded, folder: str | pathlib.Path | None = None) -> Corpus:
    """Every cached sequence for this target (ids long, hidden/top_p half)."""
    folder = pathlib.Path(folder) if folder else data_dir(target_loaded)
    shards = sorted(folder.glob("shard-*.pt"))
    if not shards:
        raise SpecvizError(f"no training data in {folder}: build it first "
                           "(`python -m specviz train draft` builds it when missing)")
    meta = _read_meta(folder)
    seqs = []
    for shard in shards:
        for row in torch.load(shard, weights_only=True):
            seqs.append(Seq(ids=row["ids"].long(), response_start=int(row["response_start"]),
                            hidden=row["hidden"], top_ids=row["top_ids"].long(), top_p=row["top_p"],
                            prompt_id=row["prompt_id"], variant=row["variant"]))
    return Corpus(seqs, meta)


def _read_meta(folder: pathlib.Path) -> dict:
    path = folder / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def build_data(target_loaded, folder: str | pathlib.Path | None = None, *,
               prompts: str | pathlib.Path = PROMPTS, passes: int = 3, max_new_tokens: int = 160,
               batch: int = 16, top_k: int = TOP_K, budget_s: float | None = None, seed: int = 0,
               temperature: float = 0.8, progress: bool = True,
               log: Callable[[str], None] | None = None) -> pathlib.Path:
    """Generate responses and record the target's hidden states and top-K probabilities.

    Pass 0 is greedy, passes 1.. sample at `temperature`. Stops after `budget_s` seconds
    (finishing the batch in hand); run again to continue where it stopped.
    """
    from .. import models

    if batch < 1 or max_new_tokens < 1 or passes < 1 or top_k < 1:
        raise SpecvizError("batch, max new tokens, passes and top-k must all be positive")
    folder = pathlib.Path(folder) if folder else data_dir(target_loaded)
    folder.mkdir(parents=True, exist_ok=True)
    rows = read_prompts(prompts)
    meta = _read_meta(folder)
    settings = {"format": FORMAT, "top_k": top_k, "max_new_tokens": max_new_tokens,
                "temperature": temperature, "target": target_loaded.name,
                "vocab": target_loaded.vocab_size}
    if meta and meta.get("settings") != settings:
        raise SpecvizError(f"{folder} holds data built with other settings {meta.get('settings')}; "
                           "delete it or use another folder")
    done = set(tuple(x) for x in meta.get("done", []))
    meta.setdefault("settings", settings)
    meta.setdefault("seconds", 0.0)
    meta["vocab"] = target_loaded.vocab_size
    meta["prompts"] = pathlib.Path(prompts).name if pathlib.Path(prompts) != PROMPTS else "assets/train/prompts.jsonl"

    # Same shuffled order in every pass, so a budget cut still covers every category.
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    todo = [(p, rows[i]) for p in range(passes) for i in order if (rows[i]["id"], p) not in done]
    encoded = {r["id"]: models.encode_prompt(target_loaded, r["prompt"]) for _, r in todo}
    start = time.perf_counter()
    shard_no = len(list(folder.glob("shard-*.pt")))
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc="self-distillation", unit="prompt", disable=not progress)
    for b in range(0, len(todo), batch):
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
        chunk = todo[b:b + batch]
        pass_no = chunk[0][0]
        prompts_ids = [encoded[r["id"]] for _, r in chunk]
        gen = torch.Generator().manual_seed(seed * 1000003 + b)
        responses = _generate(target_loaded, prompts_ids, max_new_tokens,
                              None if pass_no == 0 else temperature, gen)
        out = []
        for (p, r), prompt_ids, response in zip(chunk, prompts_ids, responses):
            ids = torch.tensor(prompt_ids + response, dtype=torch.long)
            hidden, top_p, top_ids = _teacher_force(target_loaded.model, ids, top_k)
            out.append({"ids": ids.int(), "response_start": len(prompt_ids), "hidden": hidden,
                        "top_ids": top_ids.int(), "top_p": top_p, "prompt_id": r["id"],
                        "variant": "greedy" if p == 0 else f"sample{p}"})
        tmp = folder / f".shard-{shard_no:05d}.tmp"
        torch.save(out, tmp)
        tmp.replace(folder / f"shard-{shard_no:05d}.pt")  # atomic: a kill never leaves half a shard
        shard_no += 1
        done.update((r["id"], p) for p, r in chunk)
        meta["done"] = sorted(done)
        meta["response_tokens"] = meta.get("response_tokens", 0) + sum(len(x) for x in responses)
        meta["tokens"] = meta.get("tokens", 0) + sum(len(o["ids"]) for o in out)
        elapsed = time.perf_counter() - start
        (folder / "meta.json").write_text(json.dumps({**meta, "seconds": meta["seconds"] + elapsed}))
        bar.update(len(chunk))
        bar.set_postfix(response_tokens=meta["response_tokens"])
        if log:
            log(f"{elapsed:7.1f}s pass {pass_no} shard {shard_no}: {meta['response_tokens']} response "
                f"tokens, {meta['tokens']} tokens in all")
    bar.close()
    meta["seconds"] += time.perf_counter() - start
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@torch.inference_mode()
def _generate(target_loaded, prompts: list[list[int]], max_new_tokens: int,
              temperature: float | None, generator: torch.Generator) -> list[list[int]]:
    """Responses (up to and including the first eos) for a batch, left-padded."""
    model = target_loaded.model
    eos = list(target_loaded.eos_token_ids)
    pad = target_loaded.tokenizer.pad_token_id
    pad = eos[0] if pad is None else pad
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    kwargs = dict(do_sample=False) if temperature is None else dict(
        do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    if temperature is not None:
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
    out = model.generate(input_ids=ids.to(target_loaded.device), attention_mask=mask.to(target_loaded.device),
                         max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                         repetition_penalty=1.0, **kwargs)
    responses = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        responses.append(row[:cut])
    return responses


@torch.inference_mode()
def _teacher_force(model, ids: torch.Tensor, top_k: int):
    """(hidden (T, H) half, top_p (T, K) half, top_ids (T, K)) of the target over `ids`."""
    device = next(model.parameters()).device
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    h = body(input_ids=ids.view(1, -1).to(device)).last_hidden_state[0]  # post final norm
    probs = torch.softmax(model.get_output_embeddings()(h).float(), dim=-1)
    top_p, top_ids = torch.topk(probs, top_k, dim=-1)
    return h.float().half().cpu(), top_p.half().cpu(), top_ids.cpu()
