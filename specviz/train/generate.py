"""The target passes of self-distillation, batched: write responses, then teacher-force.

`generate` decodes many sequences per forward (left padding, one position id per row; on a
CPU specviz's own batched decode over a preallocated cache, elsewhere transformers') and
drops finished rows from the batch, so a long straggler does not carry a full batch of
finished rows. `teacher_force` runs the finished sequences through the target once more (on
a CPU, specviz's own forward a sequence at a time: no padding, and the engine's multiplies,
faster than transformers' padded batch; elsewhere one padded batch) and keeps the final hidden
state and the top-K next-token probabilities at every position. `write_and_force` does both
in one pass where the target itself writes on a CPU: its decode steps are those states.

Precision: `generate` may run a bf16 copy of the target (the text only has to be the
target's own kind of text); the recorded states are always the target's as loaded (fp32 on
CPU), the features and probabilities a drafter meets at inference.
"""
from __future__ import annotations

import torch

LOGIT_ROWS = 2048  # positions per LM-head chunk: (rows, vocab) fp32 logits stay ~400 MB at 49k vocab
FORCE_TOKENS = 8192  # padded tokens per teacher-forced forward (activations stay a few hundred MB)


def pad_left(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), each (B, longest): prompts right-aligned so every row's next token is at -1."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask


@torch.inference_mode()
def generate(model, prompts: list[list[int]], max_new_tokens: int, eos: list[int], pad: int, *,
             temperature: float | None = None, generator: torch.Generator | None = None) -> list[list[int]]:
    """Each prompt's response, up to and including its first eos (or `max_new_tokens` long).

    temperature None is greedy; otherwise tokens are sampled from softmax(logits / T)
    with `generator`, so a seed fixes the text. On a CPU, for the layouts llama_fast takes,
    specviz's own batched decode (`_generate_fast`); elsewhere transformers' forward."""
    if can_write_and_force(model):
        return _generate_fast(model, prompts, max_new_tokens, eos, temperature, generator)[0]
    return _generate_hf(model, prompts, max_new_tokens, eos, pad, temperature, generator)


def _pick(logits: torch.Tensor, temperature: float | None, generator: torch.Generator | None) -> torch.Tensor:
    """argmax, or one draw per row from the tempered distribution."""
    if temperature is None:
        return logits.argmax(-1)
    return draw(torch.softmax(logits.float() / temperature, -1).cpu(), generator).to(logits.device)


def _generate_hf(model, prompts, max_new_tokens, eos, pad, temperature, generator) -> list[list[int]]:
    """Left padding, one position id per row, transformers' DynamicCache; a row leaves the
    batch (cache, mask, positions) the step it writes eos."""
    from transformers import DynamicCache

    from ..modeling import stack
    from ..modeling.forward import cache_kwargs

    device = next(model.parameters()).device
    ids, mask = pad_left(prompts, pad)
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # each row counts from its own first real token
    cache = DynamicCache()
    body, head = stack.body(model), model.get_output_embeddings()
    # ALiBi families (BLOOM, MPT) take no position ids: they read positions off the mask
    positioned = stack.takes(body, "position_ids")

    def forward(ids, mask, pos):  # last position's logits; the head sees (B, H), which keeps
        # bf16 on the plain matmul path (a (B, 1, H) input took a batched copy of the weight)
        where = {"position_ids": pos} if positioned else {}
        out = body(input_ids=ids, attention_mask=mask, **where, **cache_kwargs(body, cache))
        return head(_final_states(out)[:, -1])

    logits = forward(ids, mask, pos)
    rows = torch.arange(len(prompts))  # which prompt each batch row still is
    next_pos = pos[:, -1] + 1
    eos_t = torch.tensor(sorted(set(eos)), device=device)
    out: list[list[int]] = [[] for _ in prompts]
    for step in range(max_new_tokens):
        tok = _pick(logits, temperature, generator)
        for r, t in zip(rows.tolist(), tok.tolist()):
            out[r].append(t)
        if step == max_new_tokens - 1:
            break
        # drop rows that just wrote eos: the cache, mask and positions lose them too
        live = ~torch.isin(tok, eos_t)
        if not bool(live.all()):
            if not bool(live.any()):
                break
            keep = live.nonzero()[:, 0]
            cache.batch_select_indices(keep)
            rows, tok, mask, next_pos = rows[keep.cpu()], tok[keep], mask[keep], next_pos[keep]
        # step: one new token per live row
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        logits = forward(tok[:, None], mask, next_pos[:, None])
        next_pos = next_pos + 1
    return out


def _generate_fast(model, prompts, max_new_tokens, eos, temperature, generator, top_k: int | None = None):
    """The same generation through llama_fast: each prompt prefilled alone (no padding
    computed), then one batched step per token over a preallocated cache whose columns the
    rows share (prompts right-aligned at the widest one). transformers' cache grows by a copy
    of every layer each step, a cost that grows with the context: here a step writes one
    column. A finished row stays (its outputs ignored) until an eighth of the batch has
    finished; then the cache is compacted, once for all of them.

    top_k: also record what teacher forcing would (`teacher_force`'s triples, for prompt and
    response): the prompts' from their prefill, each written token's from the step that feeds
    it (a row's last token is fed once more for that). Returns (responses, records or None)."""
    from ..modeling import llama_fast

    n, width = len(prompts), max(len(q) for q in prompts)
    ks, vs, visible, states = _prefill(model, prompts, width + max_new_tokens)
    head = lambda x: llama_fast.head(model, x)  # noqa: E731
    # kept[i]: row i's recorded (hidden, top_p, top_ids) blocks, the prompt's first
    kept = [[r] for r in _records(torch.cat(states), [len(q) for q in prompts], head, top_k)] if top_k else None
    logits = head(torch.stack([h[-1] for h in states]))
    rows = torch.arange(n)  # which prompt each batch row is
    alive = torch.ones(n, dtype=torch.bool)  # still writing
    positions = torch.tensor([len(q) for q in prompts])
    eos_t = torch.tensor(sorted(set(eos)))
    out: list[list[int]] = [[] for _ in prompts]
    for step in range(max_new_tokens):
        tok = torch.zeros(len(rows), dtype=torch.long)
        tok[alive] = _pick(logits[alive], temperature, generator)
        for r, t in zip(rows[alive].tolist(), tok[alive].tolist()):
            out[r].append(t)
        wrote = alive.clone()
        alive &= ~torch.isin(tok, eos_t)
        if step == max_new_tokens - 1:
            alive[:] = False
        fed = alive | wrote if top_k else alive  # recording feeds each row's last token too
        if not bool(fed.any()):
            break
        done = len(rows) - int(fed.sum())
        if done and done >= len(rows) // 8:  # compact: drop the finished rows everywhere
            keep = fed.nonzero()[:, 0]
            ks, vs = [t[keep] for t in ks], [t[keep] for t in vs]
            rows, tok, visible, positions = rows[keep], tok[keep], visible[keep], positions[keep]
            alive, wrote, fed = alive[keep], wrote[keep], fed[keep]
        col = width + step
        visible[:, col] = True
        h = llama_fast.decode_rows(model, tok, ks, vs, col, visible[:, :col + 1], positions)
        if not top_k and not bool(alive.any()):
            break
        logits = head(h)
        if top_k:  # the step's states and top-K are the written tokens' records
            _record_step(kept, rows[wrote], h[wrote], logits[wrote], top_k)
            if not bool(alive.any()):
                break
        positions = positions + 1
    if not top_k:
        return out, None
    return out, [tuple(torch.cat(x) for x in zip(*blocks)) for blocks in kept]


def _prefill(model, prompts, columns):
    """Each prompt prefilled alone into its row of one shared cache `columns` wide, right-aligned at
    the widest prompt: (keys, values per layer, visible (rows, columns), each prompt's states)."""
    from ..modeling import llama_fast

    width, dtype = max(len(q) for q in prompts), next(model.parameters()).dtype
    cache = llama_fast.new_cache(model)
    shape = (len(prompts), cache.kv_heads, columns, cache.head_dim)
    ks = [torch.zeros(shape, dtype=dtype) for _ in range(model.config.num_hidden_layers)]
    vs = [torch.zeros(shape, dtype=dtype) for _ in range(model.config.num_hidden_layers)]
    visible = torch.zeros(len(prompts), columns, dtype=torch.bool)
    states = []
    for i, q in enumerate(prompts):
        one = llama_fast.new_cache(model)
        states.append(llama_fast.hidden_states(model, torch.tensor(q, dtype=torch.long), one))
        for big, small in zip((*ks, *vs), (*one.k, *one.v)):
            big[i, :, width - len(q):width] = small[:, :len(q)]
        visible[i, width - len(q):width] = True
    return ks, vs, visible, states


def _record_step(kept, rows, h, logits, top_k) -> None:
    """Each written token's (hidden, top_p, top_ids) block onto its prompt's records."""
    p, t = _top(logits, top_k)
    for r, *block in zip(rows.tolist(), h.half(), p, t):
        kept[r].append([x[None] for x in block])


@torch.inference_mode()
def write_and_force(model, prompts: list[list[int]], max_new_tokens: int, eos: list[int], top_k: int, *,
                    temperature: float | None = None, generator: torch.Generator | None = None):
    """`generate` and `teacher_force` in one pass, where the model itself writes (on a CPU, for
    the layouts llama_fast takes; see `can_write_and_force`): [(response, (hidden, top_p,
    top_ids))], the triple over prompt + response as `teacher_force` gives it. The states a
    decode step computes are the ones a second forward would, so none is run: on the
    embedded target this costs less than a bf16 copy writing and the fp32 target forcing,
    and the greedy text is the target's own."""
    out, records = _generate_fast(model, prompts, max_new_tokens, eos, temperature, generator, top_k)
    return list(zip(out, records))


def can_write_and_force(model) -> bool:
    """Does specviz's own forward take this model here (a CPU, a layout llama_fast takes)? Then
    `generate` and `teacher_force` run through it, and `write_and_force` applies."""
    from ..modeling import llama_fast

    return next(model.parameters()).device.type == "cpu" and llama_fast.supports(model)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of `probs` (B, V), by inverse CDF: a uniform u per row picks the first
    token whose cumulative probability exceeds u times the row's total, so a token of
    probability 0 is never picked. (torch.multinomial draws an exponential per vocabulary entry:
    at 49k tokens and 32 rows that was 15% of a sampled batch's generation time.)"""
    cdf = probs.cumsum(-1)
    u = torch.rand(len(probs), 1, generator=generator, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[-1] - 1)[:, 0]


@torch.inference_mode()
def teacher_force(model, sequences: list[torch.Tensor], top_k: int, pad: int = 0, max_tokens: int = FORCE_TOKENS):
    """For each sequence: (hidden (T, H) half, top_p (T, K) half, top_ids (T, K) long), the
    target's final hidden state (post norm: its LM head's input) and top-K next tokens after
    every token. Sequences go in groups of similar lengths holding at most `max_tokens`
    padded tokens (a batch usually fits in one), which bounds the memory of transformers'
    padded forward and of the logits."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out, group = [None] * len(sequences), []
    for i in order + [None]:
        longest = len(sequences[i]) if i is not None else 0
        if group and (i is None or (len(group) + 1) * longest > max_tokens):
            for j, got in zip(group, _force(model, [sequences[j] for j in group], top_k, pad)):
                out[j] = got
            group = []
        if i is not None:
            group.append(i)
    return out


def _force(model, sequences, top_k, pad):
    from ..modeling import llama_fast, stack

    device = next(model.parameters()).device
    lengths = [len(s) for s in sequences]
    if can_write_and_force(model):
        # specviz's own forward, one sequence at a time: no padding, and the multiplies the
        # engine runs at inference (oneDNN's), faster with the same top-1 (docs/performance.md).
        # A GPU keeps the one padded batch: it wants the big multiplies.
        flat = torch.cat([llama_fast.hidden_states(model, s.to(device), llama_fast.new_cache(model))
                          for s in sequences])
        head = lambda h: llama_fast.head(model, h)  # noqa: E731
    else:
        ids = torch.full((len(sequences), max(lengths)), pad, dtype=torch.long)
        for i, s in enumerate(sequences):
            ids[i, :len(s)] = s
        h = _final_states(stack.body(model)(input_ids=ids.to(device)))
        flat = torch.cat([h[i, :n] for i, n in enumerate(lengths)])  # the real positions
        head = model.get_output_embeddings()
    return _records(flat, lengths, head, top_k)


def _records(flat, lengths, head, top_k):
    """Split (hidden, top_p, top_ids) per sequence from the stacked final states `flat`
    (the LM head runs in chunks, so the logits stay small)."""
    chunks = [_top(head(flat[a:a + LOGIT_ROWS]), top_k) for a in range(0, len(flat), LOGIT_ROWS)]
    top_p, top_ids = (torch.cat(x).split(lengths) for x in zip(*chunks))
    hidden = flat.float().half().cpu().split(lengths)
    return list(zip(hidden, top_p, top_ids))


def _top(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-K next-token probabilities (half) and their ids, per row of logits."""
    p, t = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1)
    return p.half().cpu(), t.cpu()


def _final_states(out) -> torch.Tensor:
    """The final hidden states from a decoder body's output (a ModelOutput, or a tuple from older code)."""
    return out[0] if isinstance(out, tuple) else out.last_hidden_state


def bf16_copy(model):
    """A bfloat16 copy of `model` for generation (the original is left as it is)."""
    import copy

    return copy.deepcopy(model).to(torch.bfloat16)
