"""`python -m specviz.train.measure`: what self-distillation costs on this machine, A/B.

Each comparison runs its arms interleaved in one process (A, B, A, B, ...) and reports
medians, beside the load average: on a shared machine the ratios mean more than the
absolute figures. Arms: one-at-a-time vs batched generation; fp32 vs a bf16 copy vs
bf16 autocast for generation, the teacher-forced pass and a training step; and how often
bf16's top-1 agrees with fp32's over the teacher-forced positions.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch

from ..modeling import models
from .data import read_prompts
from .generate import bf16_copy, generate, teacher_force


def autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def rounds(arms: dict, n: int) -> dict:
    """Median of `n` interleaved runs per arm; an arm returns (units done, seconds)."""
    got = {k: [] for k in arms}
    for _ in range(n):
        for name, arm in arms.items():
            units, seconds = arm()
            got[name].append(units / seconds)
    return {k: statistics.median(v) for k, v in got.items()}


def timed(fn):
    def arm():
        t0 = time.perf_counter()
        units = fn()
        return units, time.perf_counter() - t0
    return arm


def show(title: str, medians: dict, unit: str) -> None:
    base = next(iter(medians.values()))
    print(f"\n{title} (load {os.getloadavg()[0]:.1f})")
    for name, v in medians.items():
        print(f"  {name:28s} {v:8.1f} {unit}  x{v / base:.2f}")


SECTIONS = ("batching", "dtype", "sizes", "force", "train")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="default")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: best on a shared 2-core machine)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--new", type=int, default=32, help="new tokens per prompt")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sections", default="batching,dtype,force,train",
                   help=f"comma-separated, from {', '.join(SECTIONS)} (sizes: batch/2, batch, 2*batch in bf16)")
    a = p.parse_args(argv)
    sections = set(a.sections.split(","))
    torch.set_num_threads(a.threads)
    t = models.load(a.target, "cpu")
    fp32, bf16 = t.model, bf16_copy(t.model)
    eos = list(t.eos_token_ids)
    pad = t.pad_token_id
    enc = sorted((models.encode_prompt(t, r["prompt"]) for r in read_prompts()[::7][:a.batch]), key=len)
    print(f"{t.name}, {a.threads} thread(s), batch {a.batch}, {a.new} new tokens, uptime load {os.getloadavg()}")

    def gen(model, prompts, ctx=contextlib.nullcontext):
        with ctx():
            return sum(len(r) for r in generate(model, prompts, a.new, eos, pad))

    if "batching" in sections:
        one = enc[:max(2, a.batch // 8)]
        show("generation, fp32", rounds({
            "one at a time": timed(lambda: sum(gen(fp32, [q]) for q in one)),
            f"batch {a.batch}": timed(lambda: gen(fp32, enc)),
        }, a.rounds), "tok/s")
    if "dtype" in sections:
        show(f"generation, batch {a.batch}", rounds({
            "fp32": timed(lambda: gen(fp32, enc)),
            "bf16 weights": timed(lambda: gen(bf16, enc)),
            "fp32 + bf16 autocast": timed(lambda: gen(fp32, enc, autocast)),
        }, a.rounds), "tok/s")
    if "sizes" in sections:
        pool = sorted((models.encode_prompt(t, r["prompt"]) for r in read_prompts()[1::5][:2 * a.batch]), key=len)
        show(f"generation, bf16 weights, {len(pool)} prompts", rounds({
            f"batch {b}": timed(lambda b=b: sum(gen(bf16, pool[i:i + b]) for i in range(0, len(pool), b)))
            for b in (a.batch // 2, a.batch, 2 * a.batch)}, a.rounds), "tok/s")
    if sections & {"force", "train"}:
        seqs = [torch.tensor(q + r) for q, r in zip(enc, generate(bf16, enc, 64, eos, pad))]
        ref = teacher_force(fp32, seqs, 32, pad)
        if "force" in sections:
            _teacher_forcing(fp32, bf16, seqs, ref, pad, a.rounds)
        if "train" in sections:
            _training_step(t, seqs, ref, a.rounds)
    return 0


def _teacher_forcing(fp32, bf16, seqs, ref, pad, n_rounds: int) -> None:
    n = sum(len(s) for s in seqs)

    def force(model, ctx=contextlib.nullcontext):
        with ctx():
            teacher_force(model, seqs, 32, pad)
        return n

    show(f"teacher-forced pass, {len(seqs)} sequences", rounds({
        "fp32": timed(lambda: force(fp32)), "bf16 weights": timed(lambda: force(bf16)),
        "fp32 + bf16 autocast": timed(lambda: force(fp32, autocast)),
    }, n_rounds), "tok/s")
    for name, model, ctx in (("bf16 weights", bf16, contextlib.nullcontext), ("bf16 autocast", fp32, autocast)):
        with ctx():
            got = teacher_force(model, seqs, 32, pad)
        top1 = torch.cat([g[2][:, 0] == r[2][:, 0] for g, r in zip(got, ref)]).float().mean()
        dp = torch.cat([(g[1][:, 0].float() - r[1][:, 0].float()).abs() for g, r in zip(got, ref)]).mean()
        print(f"  {name} vs fp32 over {n} positions: top-1 agreement {top1:.3f}, mean |p1 diff| {dp:.4f}")


def _training_step(t, seqs, forced, n_rounds: int) -> None:
    from .data import Corpus, Seq
    from .draft import DRAFT
    from .eagle import EAGLE

    corpus = Corpus([Seq(ids=s, response_start=1, hidden=h, top_ids=i, top_p=p)
                     for s, (h, p, i) in zip(seqs, forced)], {"vocab": t.vocab_size})
    batch = corpus.sequences[:8]
    for recipe in (EAGLE, DRAFT):
        module = recipe.build(t, corpus).train()
        opt = torch.optim.AdamW([q for q in module.parameters() if q.requires_grad], lr=1e-4)

        def step(ctx):
            def run():
                with ctx():
                    loss, _ = recipe.loss(module, t, batch)
                loss.backward()
                opt.step()
                opt.zero_grad()
                return 1
            return run

        show(f"training step, {recipe.kind}, batch {len(batch)}", rounds({
            "fp32": timed(step(contextlib.nullcontext)), "bf16 autocast": timed(step(autocast)),
        }, n_rounds), "steps/s")


if __name__ == "__main__":
    raise SystemExit(main())
