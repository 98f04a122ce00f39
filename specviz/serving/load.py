"""The multi-tenant trade-off: the same closed-loop load on a server with speculation and on one
without, at rising concurrency, to see where speculation stops paying.

Speculation spends spare compute on drafts; at low concurrency the GPU (or CPU) idles between
one request's tokens and the drafts are nearly free, under heavy batching every drafted token
that is rejected takes a slot another request could have used. The sweep measures both arms
at each level, interleaved, and stops by itself (max_minutes).
"""
from __future__ import annotations

import datetime
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable
from urllib.parse import urlsplit

from ..core.errors import SpecvizError
from ..modeling.chat import chat_messages
from ..modeling.threads import load_average
from . import prometheus
from .load_stats import summarize
from .records import ServerRun
from .urls import base_url, check_url, is_loopback

ARMS = ("baseline", "speculative")


@dataclass(frozen=True)
class LoadConfig:
    server: str  # the server with speculation on
    baseline_server: str  # the same model, speculation off
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)  # closed-loop workers per level, ascending
    requests: int = 64  # requests per level and arm
    max_tokens: int = 128
    prompts: tuple = ()  # strings or conversations ((role, text) pairs); empty: the prompts of `suite`
    suite: str = "default"  # a bench suite (assets/bench/NAME.jsonl) or a JSONL path
    model: str | None = None  # None: the server's own (the client asks /v1/models)
    chat: bool = True
    temperature: float = 0.0  # greedy: both arms then produce the same text, so the same work
    max_minutes: float = 20.0  # the whole sweep's bound: stop issuing, finish what is in flight
    warmup: int = 2  # requests per server before timing, not counted (first-request compile, caches)
    timeout_s: float = 120.0  # per request
    allow_remote: bool = False  # the servers are yours: a load test on someone else's is an attack

    def validate(self) -> "LoadConfig":
        for name in ("server", "baseline_server"):
            check_local(getattr(self, name), "--" + name.replace("_", "-"), self.allow_remote)
        if base_url(self.server) == base_url(self.baseline_server):
            raise SpecvizError("--server and --baseline-server are the same URL: the sweep needs one server with "
                               "speculation on and one with it off (scripts/serve-vllm.sh --spec off --port 8001)")
        if not self.concurrency:
            raise SpecvizError("--concurrency needs at least one level, e.g. 1,2,4,8,16")
        if any(not 1 <= c <= 256 for c in self.concurrency):
            raise SpecvizError(f"concurrency levels must be 1 to 256; got {','.join(map(str, self.concurrency))}")
        if list(self.concurrency) != sorted(set(self.concurrency)):
            raise SpecvizError("concurrency levels must be distinct and ascending, e.g. 1,2,4,8,16")
        if not 1 <= self.requests <= 10_000:
            raise SpecvizError(f"--requests must be 1 to 10,000 per level; got {self.requests}")
        if self.requests < self.concurrency[-1]:
            raise SpecvizError(f"--requests {self.requests} is below concurrency {self.concurrency[-1]}: that level "
                               "would never have that many requests in flight; ask for at least as many requests")
        if not 1 <= self.max_tokens <= 32_768:
            raise SpecvizError(f"--max-tokens must be 1 to 32768; got {self.max_tokens}")
        if not 0 < self.max_minutes <= 24 * 60:
            raise SpecvizError(f"--max-minutes must be above 0 and at most a day (1440); got {self.max_minutes}")
        if not 0 <= self.warmup <= 100:
            raise SpecvizError(f"--warmup must be 0 to 100 requests; got {self.warmup}")
        if self.temperature < 0 or self.timeout_s <= 0:
            raise SpecvizError("temperature must be >= 0 and the request timeout above 0")
        return self


def check_local(url: str, flag: str, allow_remote: bool) -> None:
    """Refuse anything but http(s) on this machine, unless the user says the server is theirs."""
    url = check_url(url, flag)
    if allow_remote or is_loopback(urlsplit(url).hostname):
        return
    raise SpecvizError(f"{flag} {url} is not on this machine (loopback: 127.0.0.0/8, ::1, localhost); a load "
                       "sweep floods its server, so pass --allow-remote only if that server is yours")


def suite_prompts(suite: str = "default") -> tuple:
    """A bench suite's prompts as the client sends them: a string for one user turn, the
    conversation's (role, text) pairs for several (sent as chat messages, so the server's chat
    template lays them out as it would for a real user). The bench's own loader reads the suite."""
    from ..run.suites import load_suite  # imports torch (through models): only when needed

    return tuple(p.messages[0][1] if len(p.messages) == 1 else tuple(p.messages) for p in load_suite(suite))


@dataclass
class ArmRun:
    """One arm at one concurrency, as measured: every request's record and the level's wall time."""

    arm: str
    concurrency: int
    runs: list[ServerRun]
    wall_s: float
    partial: bool = False
    counters: object | None = None  # the speculative server's /metrics change over the level (SpecCounters)
    starts_s: list[float] = field(default_factory=list)  # each request's send time, from the level's start
    max_in_flight: int = 0


@dataclass
class LoadResult:
    config: LoadConfig
    arms: list[ArmRun]  # in the order they ran
    started: str
    finished: str
    stopped_early: bool = False
    notes: list[str] = field(default_factory=list)
    load_average_before: float | None = None  # 1-minute load: company on the machine skews both arms


def run_level(send: Callable[[str], ServerRun], prompts, concurrency: int, requests: int, deadline: float,
              clock=time.monotonic, on_request=None) -> tuple[list[ServerRun], float, list[float], int]:
    """A closed loop: `concurrency` workers each send the next prompt as soon as their last
    request finished, until `requests` are sent or the deadline passes (in-flight ones finish).

    Every level starts at prompt 0, so both arms at a level see the same prompts in the same
    order. Returns the records in sending order, the wall time (first send to last finish),
    each send time and the most requests in flight at once."""
    lock = threading.Lock()
    records: list = [None] * requests
    sent, finished, in_flight, most = [0], [0], [0], [0]
    t0 = clock()
    last_finish = [t0]

    def worker():
        while True:
            with lock:
                i = sent[0]
                if i >= requests or clock() >= deadline:
                    return
                sent[0] += 1
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            start = clock()
            try:
                run = send(prompts[i % len(prompts)])
            except Exception as e:  # noqa: BLE001 - a worker that dies would lose its count and hang the tail
                run = ServerRun(url="", model="", error=f"{type(e).__name__}: {e}")
            with lock:
                in_flight[0] -= 1
                last_finish[0] = max(last_finish[0], clock())
                records[i] = (start - t0, run)
                finished[0] += 1
                if on_request is not None:
                    on_request(finished[0])

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, requests))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    done = [r for r in records if r is not None]
    starts = [s for s, _ in done]
    wall = last_finish[0] - t0 - min(starts, default=0.0)
    return [run for _, run in done], wall, starts, most[0]


def sweep(cfg: LoadConfig, request=None, read_counters=None, progress=None, clock=time.monotonic) -> LoadResult:
    """Both arms at every level, interleaved: baseline first at the first level, speculative
    first at the next, and so on, so a slow drift of the machine (heat, a neighbour) falls on
    both arms alike.

    request(url, prompt, **options) -> ServerRun: default client.stream_completion.
    read_counters(server_url) -> SpecCounters | None: default /metrics through prometheus.
    progress(arm, concurrency, done, requests, stats): after each request (stats None; called
    from a worker thread, one at a time) and after each arm's level (stats: its ArmStats)."""
    request = request or _stream_completion
    read_counters = read_counters or prometheus.read_spec_counters  # None: the requests' own fields stand in
    prompts = cfg.prompts or suite_prompts(cfg.suite)
    options = dict(model=cfg.model, max_tokens=cfg.max_tokens, temperature=cfg.temperature, chat=cfg.chat,
                   timeout_s=cfg.timeout_s)
    urls = {"baseline": cfg.baseline_server, "speculative": cfg.server}
    started = _now()
    deadline = clock() + cfg.max_minutes * 60  # the bound covers the warm-up too: it is the whole command's
    for arm in ARMS:
        warm_up(request, urls[arm], prompts, cfg.warmup, options)
    result = LoadResult(replace(cfg, prompts=tuple(prompts)), [], started, started, load_average_before=load_average())
    for i, c in enumerate(cfg.concurrency):
        for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):
            if clock() >= deadline:
                result.stopped_early = True
                continue
            url = urls[arm]
            before = read_counters(url) if arm == "speculative" else None
            tick = (lambda done, arm=arm, c=c: progress(arm, c, done, cfg.requests, None)) if progress else None
            runs, wall, starts, most = run_level(lambda p, url=url: request(url, p, **options), prompts, c,
                                                 cfg.requests, deadline, clock, tick)
            after = read_counters(url) if arm == "speculative" else None
            delta = after - before if before is not None and after is not None else None
            partial = len(runs) < cfg.requests
            result.stopped_early |= partial
            result.arms.append(ArmRun(arm, c, runs, wall, partial, delta, starts, most))
            if progress:
                progress(arm, c, len(runs), cfg.requests, summarize(arm, c, runs, wall, delta, partial))
    if result.stopped_early:
        full = [(a.arm, a.concurrency) for a in result.arms if not a.partial]
        measured = {c for c in cfg.concurrency if all((arm, c) in full for arm in ARMS)}
        result.notes.append(f"stopped at --max-minutes {cfg.max_minutes:g}: levels not fully measured: "
                            + ", ".join(str(c) for c in cfg.concurrency if c not in measured))
    result.finished = _now()
    return result


def warm_up(request, url: str, prompts, n: int, options: dict) -> None:
    """A few untimed requests; if every one fails, the server is not there: say so now rather
    than after a sweep of failures."""
    runs = [request(url, prompts[i % len(prompts)], **{**options, "max_tokens": min(16, options["max_tokens"])})
            for i in range(n)]
    if runs and all(r.error is not None for r in runs):
        raise SpecvizError(f"no answer from {url} during warm-up: {runs[-1].error}")


def _stream_completion(url, prompt, **options) -> ServerRun:
    """One request: a prompt string, or a conversation's (role, text) pairs as chat messages."""
    from .client import stream_completion

    if isinstance(prompt, str):
        return stream_completion(url, prompt, **options)
    return stream_completion(url, prompt[-1][1], messages=chat_messages(prompt), **options)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
