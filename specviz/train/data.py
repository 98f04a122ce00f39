"""Training data by self-distillation: the target answers a pool of prompts.

Two passes per batch of prompts (train/generate.py):
1. generate: the target writes a response to each prompt (many per forward, left padding;
   the first pass is greedy, later passes sample so the same prompt gives new text);
2. teacher-force: one forward over the finished sequences records, after every token, the
   target's final hidden state (post norm: exactly its LM head's input) and its top-K
   next-token probabilities.
When the target itself writes on a CPU (the default there), the two are one pass: its
decode steps compute exactly the states a forward over the finished text would, and they
are recorded as it writes (generate.write_and_force); a bf16 copy or a GPU keeps two passes.
Prompt positions are kept too: teacher-forcing text is ~3x cheaper than generating it,
so the prompts themselves are extra distillation data for free.

On disk under `$SPECVIZ_CACHE/train/<target fingerprint[:12]>/`: `meta.json` (settings,
which (prompt, pass) pairs are done, which shards hold them) and `shard-NNNNN.pt` files,
each a list of sequences. Building is resumable: meta.json is written after its shard, so
a killed run keeps every finished shard and a shard meta.json does not list is redone.
"""
from __future__ import annotations

import hashlib
import json
import math
import pathlib
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..core.errors import SpecvizError
from .generate import can_write_and_force, generate, teacher_force, write_and_force
from .prompt_sources import PROMPTS, read_prompts

TOP_K = 32  # how many of the target's next-token probabilities each position keeps
FORMAT = 1
WINDOW = 8  # batches per window of prompts sorted by length (less padding, same mix)


@dataclass
class Seq:
    ids: torch.Tensor  # (T,) long: prompt (chat-formatted) then response
    response_start: int  # ids[response_start:] is what the target wrote
    hidden: torch.Tensor  # (T, H) half: target's final hidden after each token
    top_ids: torch.Tensor  # (T, K) long: target's top-K next tokens after each token
    top_p: torch.Tensor  # (T, K) half: their probabilities
    prompt_id: str = ""
    variant: str = "greedy"  # which pass wrote the response ("greedy", "sample1", ...)
    source: str = "written"  # which prompt source ("written", "self", "code", "docs")
    taps: torch.Tensor | None = None  # (T, n * H) half: inputs of inner target layers (EAGLE-3), when loaded


@dataclass
class Corpus:
    sequences: list[Seq]
    meta: dict = field(default_factory=dict)

    def split(self, held_out: int) -> tuple["Corpus", "Corpus"]:
        """(train, held): `held_out` prompts chosen by a hash of their id among the written
        prompts (among all when there are none), so the choice moves neither when more passes
        nor when more generated prompts are added. The written prompts are the whole written
        pool the data was built from (meta "written_pool"), not only those answered so far: a
        build that answers more of them later leaves the choice where it was, and never holds
        out a prompt an earlier run trained on. Held prompts keep only their greedy response,
        and none of their responses is trained on."""
        written = set(self.meta.get("written_pool", ())) or {s.prompt_id for s in self.sequences if s.source == "written"}
        keys = sorted(written or {s.prompt_id for s in self.sequences}, key=_stable_hash)
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
    from ..modeling.embedded import cache_dir

    return cache_dir() / "train" / fingerprint(target_loaded.model)[:12]


def load_data(target_loaded, folder: str | pathlib.Path | None = None, taps: tuple[int, ...] = ()) -> Corpus:
    """Every cached sequence for this target (ids long, hidden/top_p half, memory-mapped);
    with `taps`, also those inner layers' inputs (recorded first by `record_taps`)."""
    folder = pathlib.Path(folder) if folder else data_dir(target_loaded)
    meta = _read_meta(folder)
    shards = _shards(folder, meta)
    if not shards:
        raise SpecvizError(f"no training data in {folder}: build it first "
                           "(`python -m specviz train draft` builds it when missing)")
    seqs = []
    for name in shards:
        rows = torch.load(folder / name, weights_only=True, mmap=True)
        inner = [None] * len(rows)
        if taps:
            path = folder / taps_name(name, taps)
            if not path.is_file():
                raise SpecvizError(f"{folder} has no recorded inputs of layers {taps_text(taps)} for {name}: "
                                   "record them first (train/data.py record_taps; `--taps` does it)")
            inner = torch.load(path, weights_only=True, mmap=True)
        if len(inner) != len(rows) or any(t is not None and len(t) != len(r["ids"]) for r, t in zip(rows, inner)):
            raise SpecvizError(f"{folder / taps_name(name, taps)} does not match {name} (left from an older "
                               "build?): delete it and record the layer inputs again")
        for row, t in zip(rows, inner):
            seqs.append(Seq(ids=row["ids"].long(), response_start=int(row["response_start"]),
                            hidden=row["hidden"], top_ids=row["top_ids"].long(), top_p=row["top_p"],
                            prompt_id=row["prompt_id"], variant=row["variant"],
                            source=source_of(row), taps=t))
    return Corpus(seqs, meta)


def taps_name(shard: str, taps: tuple[int, ...]) -> str:
    """The file beside a shard that holds its sequences' inputs of layers `taps`."""
    return f"taps-{taps_text(taps, '-')}-{shard}"


def taps_text(taps, sep: str = ", ") -> str:
    """(2, 15) -> "2, 15" (or "2,15", as --taps takes them)."""
    return sep.join(map(str, taps))


def check_taps(taps: tuple[int, ...], n_layers: int | None = None) -> None:
    """Taps are inner decoder layers of the target, distinct and increasing; with `n_layers`
    (once the target is known) each also below it."""
    if (not taps or list(taps) != sorted(set(taps)) or taps[0] < 0
            or (n_layers is not None and taps[-1] >= n_layers)):
        span = (f", each in 0-{n_layers - 1} (this target has {n_layers} layers; the final state is always read)"
                if n_layers is not None else ", e.g. 2,15 (the final state is always read)")
        raise SpecvizError(f"taps are distinct decoder layers in increasing order{span}, got {taps_text(taps) or 'none'}")


@torch.inference_mode()
def record_taps(target_loaded, folder: str | pathlib.Path | None, taps: tuple[int, ...], *,
                progress: bool = True, log: Callable[[str], None] | None = None) -> None:
    """Record, beside each shard, the inputs of the target's decoder layers `taps` after every
    stored token (fp16, a list of (T, len(taps) * H) tensors in the shard's order).

    A shard keeps only the final state; EAGLE-3's fused features also read inner layers.
    One teacher-forced pass over the stored text, running only the layers up to the last
    tap, on the target as loaded (the states the engine hands a drafter). Resumable: a
    shard whose file exists is skipped, and each file is written whole or not at all."""
    from tqdm.auto import tqdm

    from ..modeling import llama_fast
    from ..modeling.forward import model_device
    from ..modeling.stack import body

    say = log or (lambda m: None)
    folder = pathlib.Path(folder) if folder else data_dir(target_loaded)
    model = target_loaded.model
    n_layers = model.config.get_text_config().num_hidden_layers
    check_taps(taps, n_layers)
    todo = [n for n in _shards(folder, _read_meta(folder)) if not (folder / taps_name(n, taps)).is_file()]
    if not todo:
        return
    fast = llama_fast.supports(model)
    device = model_device(model)
    per_token = 2 * len(taps) * model.config.get_text_config().hidden_size
    say(f"recording the inputs of layers {taps_text(taps)} for {len(todo)} shards in {folder} "
        f"({per_token} bytes per token; resumable)")
    bar = tqdm(total=len(todo), desc="layer inputs", unit="shard", disable=not progress)
    for name in todo:
        t0, out = time.perf_counter(), []
        rows = torch.load(folder / name, weights_only=True, mmap=True)
        for row in rows:
            ids = row["ids"].long().to(device)
            if fast:
                _, found = llama_fast.states(model, ids, llama_fast.new_cache(model), layers=taps, final=False)
            else:
                hs = body(model)(input_ids=ids.view(1, -1), output_hidden_states=True).hidden_states
                found = [hs[t][0] for t in taps]
            out.append(torch.cat(found, -1).half().cpu())
        tmp = folder / f".{taps_name(name, taps)}.tmp"
        torch.save(out, tmp)
        tmp.replace(folder / taps_name(name, taps))
        tokens = sum(len(r["ids"]) for r in rows)
        bar.update(1)
        bar.set_postfix_str(f"{tokens / (time.perf_counter() - t0):.0f} tok/s")
    bar.close()


def _shards(folder: pathlib.Path, meta: dict) -> list[str]:
    """The shards meta.json lists (data from before it listed them: every shard file)."""
    if "shards" in meta:
        return list(meta["shards"])
    return sorted(p.name for p in folder.glob("shard-*.pt"))


def _read_meta(folder: pathlib.Path) -> dict:
    path = folder / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_meta(folder: pathlib.Path, meta: dict) -> None:
    tmp = folder / ".meta.json.tmp"
    tmp.write_text(json.dumps(meta))
    tmp.replace(folder / "meta.json")  # atomic: the commit point of each shard


def bytes_per_token(hidden: int, top_k: int = TOP_K) -> int:
    """Disk per stored position: the hidden state (fp16), top-K ids (int32) and
    probabilities (fp16), and the token id itself (int32)."""
    return 2 * hidden + (4 + 2) * top_k + 4


def disk_estimate(hidden: int, top_k: int, response_tokens: int, prompt_tokens: int) -> int:
    return bytes_per_token(hidden, top_k) * (response_tokens + prompt_tokens)


def plan(rows: list[dict], lengths: dict, passes: int, batch: int, seed: int) -> list[list[tuple[int, dict]]]:
    """Every (pass, prompt) in build order, cut into batches. Prompts take turns by source
    (each source in its own seeded shuffle, the same each pass), so a budget cut holds every
    source in equal parts while the smallest lasts: a short CPU build of the default pool is
    half chat-like prompts, not 90% code and documentation tasks as a plain shuffle of its
    10,000 rows made it. Within windows of WINDOW batches prompts are sorted by length so a
    batch pads little. A pure function of its inputs: a resumed build makes the batches an
    unbroken one makes."""
    order = by_turns(rows, seed)
    out = []
    for p in range(passes):
        for w in range(0, len(order), batch * WINDOW):
            window = sorted(order[w:w + batch * WINDOW], key=lambda i: lengths[rows[i]["id"]])
            out += [[(p, rows[i]) for i in window[b:b + batch]] for b in range(0, len(window), batch)]
    return out


def remaining(batches: list[list[tuple[int, dict]]], done: set, lengths: dict, batch: int):
    """The batches still to build, as (seed index, [(pass, row)]), in build order.

    Batches left whole run as planned, seeded by their place in the plan, so a resumed build of
    the same pool makes what an unbroken one makes. Batches a grown pool left part-done (its new
    prompts joined their windows) would run a few rows at a time, at a fraction of a full batch's
    throughput: their rows are pooled per pass, sorted by length within windows of WINDOW
    batches and cut into whole batches again, each seeded by an index past the plan's."""
    out, pools = [], {}
    for j, b in enumerate(batches):
        left = [(p, r) for p, r in b if (r["id"], p) not in done]
        if len(left) == len(b):
            out.append((j, j, left))
        elif left:
            pools.setdefault(left[0][0], []).extend((j, x) for x in left)  # a planned batch is one pass
    extra = len(batches)
    for p in sorted(pools):
        items = pools[p]
        for w in range(0, len(items), batch * WINDOW):
            window = sorted(items[w:w + batch * WINDOW], key=lambda x: lengths[x[1][1]["id"]])
            for c in range(0, len(window), batch):
                part = window[c:c + batch]
                out.append((min(j for j, _ in part), extra, [x for _, x in part]))
                extra += 1
    out.sort(key=lambda x: x[0])  # build order: where each batch's first row was planned
    return [(seed, b) for _, seed, b in out]


def source_of(row: dict) -> str:
    """The source of a prompt row or a stored sequence (plain prompt files and older shards name
    none: theirs are prompts written for the project)."""
    return row.get("source", "written")


def by_turns(rows: list[dict], seed: int) -> list[int]:
    """Row indices, one per source in turn (sources by name, each shuffled with `seed`)."""
    queues: dict[str, list[int]] = {}
    for i in torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist():
        queues.setdefault(source_of(rows[i]), []).append(i)
    turns = [queues[name] for name in sorted(queues)]
    return [q[r] for r in range(max(map(len, turns), default=0)) for q in turns if r < len(q)]


def build_data(target_loaded, folder: str | pathlib.Path | None = None, *,
               prompts: str | pathlib.Path | list[dict] = PROMPTS, passes: int = 3, max_new_tokens: int = 160,
               batch: int = 64, top_k: int = TOP_K, budget_s: float | None = None,
               budget_tokens: int | None = None, seed: int = 0, temperature: float = 0.8,
               generate_model=None, progress: bool = True, log: Callable[[str], None] | None = None) -> pathlib.Path:
    """Generate responses and record the target's hidden states and top-K probabilities.

    prompts: a JSONL file or rows ({"id", "prompt", "source"?}, e.g. from prompts.gather).
    Pass 0 is greedy, passes 1.. sample at `temperature`. Stops once `budget_tokens`
    target-written tokens are stored or after `budget_s` seconds (finishing the batch in
    hand); run again to continue where it stopped. generate_model: what writes the
    responses (e.g. a bf16 copy of the target); the teacher-forced pass always runs the
    target itself. Before starting it states the disk the token budget needs, and refuses
    when the disk lacks it.
    """
    from tqdm.auto import tqdm

    from ..modeling import models

    if min(batch, max_new_tokens, passes, top_k, 1 if budget_tokens is None else budget_tokens) < 1:
        raise SpecvizError("batch, max new tokens, passes, top-k and the token budget must all be positive")
    say = log or (lambda m: None)
    folder = pathlib.Path(folder) if folder else data_dir(target_loaded)
    folder.mkdir(parents=True, exist_ok=True)
    rows = read_prompts(prompts) if isinstance(prompts, (str, pathlib.Path)) else list(prompts)
    settings = {"format": FORMAT, "top_k": top_k, "max_new_tokens": max_new_tokens,
                "temperature": temperature, "target": target_loaded.name, "vocab": target_loaded.vocab_size}
    meta = _open_meta(folder, settings, rows, prompts)
    done = set(map(tuple, meta["done"]))

    encoded = {r["id"]: models.encode_prompt(target_loaded, r["prompt"]) for r in rows}
    lengths = {k: len(v) for k, v in encoded.items()}
    todo = remaining(plan(rows, lengths, passes, batch, seed), done, lengths, batch)
    _check_disk(folder, target_loaded, top_k, todo, encoded, budget_tokens, meta, max_new_tokens, say)

    eos = list(target_loaded.eos_token_ids)
    pad = target_loaded.pad_token_id
    writer = generate_model or target_loaded.model
    one_pass = writer is target_loaded.model and can_write_and_force(writer)
    bar = tqdm(total=budget_tokens, initial=min(meta["response_tokens"], budget_tokens or 1 << 62),
               desc="self-distillation", unit="tok", unit_scale=True, disable=not progress)
    start = time.perf_counter()
    for j, chunk in todo:
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
        if budget_tokens is not None and meta["response_tokens"] >= budget_tokens:
            break
        t0 = time.perf_counter()
        # generate: the whole batch at once; sampled passes draw from a generator seeded by
        # the batch's place in the plan, so a resumed build writes the same text
        pass_no = chunk[0][0]
        prompt_ids = [encoded[r["id"]] for _, r in chunk]
        sampling = dict(temperature=None if pass_no == 0 else temperature,
                        generator=torch.Generator().manual_seed(seed * 1_000_003 + j))
        responses, forced = _write_batch(writer, one_pass, prompt_ids, max_new_tokens, eos, pad, top_k, sampling)
        t1 = time.perf_counter()
        seqs = [torch.tensor(q + r, dtype=torch.long) for q, r in zip(prompt_ids, responses)]
        if not one_pass:  # teacher-force: the target itself over the finished sequences
            forced = teacher_force(target_loaded.model, seqs, top_k, pad)
        t2 = time.perf_counter()
        # save: the shard first, then meta.json that lists it (a kill in between redoes it)
        name = f"shard-{len(meta['shards']):05d}.pt"
        torch.save(_stored(chunk, seqs, prompt_ids, forced), folder / f".{name}.tmp")
        (folder / f".{name}.tmp").replace(folder / name)
        written = sum(map(len, responses))
        done.update((r["id"], n) for n, r in chunk)
        meta.update(done=sorted(done), shards=meta["shards"] + [name],
                    response_tokens=meta["response_tokens"] + written,
                    tokens=meta["tokens"] + sum(len(x) for x in seqs), seconds=meta["seconds"] + t2 - t0,
                    generate_seconds=meta.get("generate_seconds", 0.0) + t1 - t0,
                    force_seconds=meta.get("force_seconds", 0.0) + t2 - t1)
        _write_meta(folder, meta)
        bar.update(written)
        bar.set_postfix_str(f"pass {pass_no}, {name}, generate {written / (t1 - t0):.0f} tok/s, "
                            + ("states recorded while writing" if one_pass
                               else f"teacher-force {sum(map(len, seqs)) / (t2 - t1):.0f} tok/s"))
    bar.close()
    say(f"data: {meta['response_tokens']:,} target-written tokens ({meta['tokens']:,} with prompts) in "
        f"{len(meta['shards'])} shards, {meta['seconds'] / 60:.1f} min of building so far")
    return folder


def _open_meta(folder: pathlib.Path, settings: dict, rows: list[dict], prompts) -> dict:
    """The folder's meta.json (refused when built with other settings), with what this build adds."""
    meta = _read_meta(folder)
    if meta and meta.get("settings") != settings:
        raise SpecvizError(f"{folder} holds data built with other settings {meta.get('settings')}; "
                           "delete it or use another folder")
    meta = {"settings": settings, "seconds": 0.0, "tokens": 0, "response_tokens": 0, "done": [], **meta,
            "shards": _shards(folder, meta), "vocab": settings["vocab"]}
    counts = Counter(source_of(r) for r in rows)  # what a model card quotes
    meta["prompts"] = (f"{pathlib.Path(prompts).name} ({len(rows)} prompts)" if isinstance(prompts, (str, pathlib.Path))
                       else f"{len(rows):,} prompts ({', '.join(f'{k} {v}' for k, v in counts.items())})")
    # The written prompts held-out ones are drawn from (Corpus.split): every one in any pool
    # this folder was built from, recorded before the first batch so a cut-short build has it.
    pool = sorted(set(meta.get("written_pool", ())) | {r["id"] for r in rows if source_of(r) == "written"})
    if pool != meta.get("written_pool"):
        meta["written_pool"] = pool
        _write_meta(folder, meta)
    return meta


def _write_batch(writer, one_pass, prompt_ids, max_new_tokens, eos, pad, top_k, sampling):
    """A batch's responses, and their teacher-forced states where the target wrote them (else None)."""
    if one_pass:  # the target writes and its decode steps are the teacher-forced states
        pairs = write_and_force(writer, prompt_ids, max_new_tokens, eos, top_k, **sampling)
        return [r for r, _ in pairs], [f for _, f in pairs]
    return generate(writer, prompt_ids, max_new_tokens, eos, pad, **sampling), None


def _stored(chunk, seqs, prompt_ids, forced) -> list[dict]:
    """A shard's records: each sequence with where its response starts and the target's states."""
    return [{"ids": ids.int(), "response_start": len(q), "hidden": h, "top_ids": i.int(), "top_p": p,
             "prompt_id": r["id"], "variant": "greedy" if n == 0 else f"sample{n}", "source": source_of(r)}
            for ids, q, (h, p, i), (n, r) in zip(seqs, prompt_ids, forced, chunk)]


def _check_disk(folder, target_loaded, top_k, todo, encoded, budget_tokens, meta, max_new_tokens, say) -> None:
    """Say how much disk the build needs; refuse when a token budget would not fit."""
    items = [r["id"] for _, b in todo for _, r in b]
    if not items:
        return
    hidden = target_loaded.model.config.hidden_size
    prompt_mean = sum(len(encoded[i]) for i in items) / len(items)
    if budget_tokens is None:
        need = disk_estimate(hidden, top_k, len(items) * max_new_tokens, round(prompt_mean * len(items)))
        say(f"disk: up to {need / 1e9:.1f} GB for every remaining prompt ({bytes_per_token(hidden, top_k)} "
            f"bytes per token); a time cap stops it sooner")
        return
    want = max(0, budget_tokens - meta["response_tokens"])
    done = len(meta["done"])
    # Mean response length so far, else half the cap: a low guess means more prompts, more disk.
    mean = meta["response_tokens"] / done if done else max_new_tokens / 2
    prompt_tokens = round(prompt_mean * min(len(items), math.ceil(want / max(mean, 1))))
    need = disk_estimate(hidden, top_k, want, prompt_tokens)
    free = shutil.disk_usage(folder).free
    say(f"disk: ~{need / 1e9:.2f} GB for {want:,} more target-written tokens + ~{prompt_tokens:,} prompt "
        f"tokens, at {bytes_per_token(hidden, top_k)} bytes per token (hidden {hidden} fp16, top-{top_k} "
        f"ids int32 + probabilities fp16, token id); {free / 1e9:.1f} GB free")
    if need * 1.05 > free:
        raise SpecvizError(f"not enough disk for {budget_tokens:,} tokens of training data in {folder}: it "
                           f"needs about {need / 1e9:.1f} GB and {free / 1e9:.1f} GB are free. Free some space, "
                           "give --data another folder, or ask for fewer --data-tokens")
