"""The load sweep: its arithmetic by hand, its closed loop against a fake server, its record,
figure and command line. No network: the request function and the counter reader are fakes."""
from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass

import pytest

from specviz.cli import main as cli
from specviz.core.errors import SpecvizError
from specviz.serving import load, load_report, prometheus
from specviz.serving.load import ArmRun, LoadConfig, LoadResult, run_level, sweep
from specviz.serving.load_stats import (ArmStats, crossover, percentile, policy_threshold, summarize,
                                        toggle_policy)
from specviz.serving.records import Chunk, ServerRun, SpecStats

SPEC, BASE = "http://127.0.0.1:8000", "http://127.0.0.1:8001"


def reply(url="", tokens=10, ttft=0.1, last=1.0, error=None, spec=None) -> ServerRun:
    chunks = [Chunk(ttft, "a", 1), Chunk(last, "b", tokens - 1)]
    return ServerRun(url, "m", "ab", chunks, completion_tokens=tokens, elapsed_s=last, error=error, spec=spec)


class FakeServer:
    """Answers every request after `delay` seconds and counts how many were in flight at once."""

    def __init__(self, delay=0.0, fail=lambda n: False, spec=None, clock=None, step=0.0):
        self.delay, self.fail, self.spec, self.clock, self.step = delay, fail, spec, clock, step
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.calls: list[tuple[str, str]] = []

    def __call__(self, url, prompt, **options):
        with self.lock:
            n = len(self.calls)
            self.calls.append((url, prompt))
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            if self.clock is not None:
                self.clock.now += self.step  # simulated time: each request takes `step` seconds
        threading.Event().wait(self.delay)
        with self.lock:
            self.in_flight -= 1
        if self.fail(n) == "raise":
            raise RuntimeError("connection reset")
        spec = self.spec if url == SPEC else None
        return reply(url, error="HTTP 500" if self.fail(n) else None, spec=spec)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@dataclass(frozen=True)
class Counters:
    """What prometheus.SpecCounters promises: cumulative counters that subtract."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple = ()

    def __sub__(self, other):
        return Counters(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                        self.accepted_tokens - other.accepted_tokens,
                        tuple(a - b for a, b in zip(self.accepted_per_position, other.accepted_per_position)))

    @property
    def acceptance_rate(self):
        return self.accepted_tokens / self.draft_tokens

    @property
    def mean_accepted_length(self):
        return 1 + self.accepted_tokens / self.drafts

    @property
    def per_position_acceptance(self):
        return [a / self.drafts for a in self.accepted_per_position]


def config(**kw) -> LoadConfig:
    kw = {"server": SPEC, "baseline_server": BASE, "concurrency": (1, 2, 4), "requests": 8, "warmup": 0,
          "prompts": ("p0", "p1", "p2"), **kw}
    return LoadConfig(**kw).validate()


# -- the arithmetic ---------------------------------------------------------------------------

def test_percentile_interpolates_linearly_between_closest_ranks():
    assert percentile([4, 1, 3, 2], 50) == 2.5  # halfway between 2 and 3
    assert percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)  # position 3 * 0.95 = 2.85
    assert percentile([1, 2, 3, 4], 0) == 1 and percentile([1, 2, 3, 4], 100) == 4
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None and percentile([None, None], 50) is None
    assert percentile([None, 1, 3], 50) == 2  # unknowns are left out, not counted as zero


def test_summarize_one_arm():
    runs = [reply(tokens=10, ttft=0.1, last=1.0), reply(tokens=20, ttft=0.3, last=2.2),
            reply(tokens=4, ttft=5.0, last=6.0, error="timeout")]
    s = summarize("baseline", 2, runs, wall_s=2.5)
    assert (s.requests, s.failed, s.tokens) == (3, 1, 34)  # the failed request's tokens were produced
    assert s.tokens_per_s == pytest.approx(34 / 2.5)
    assert s.ttft_p50_s == pytest.approx(0.2)  # failed requests' latencies left out
    assert s.itl_p50_s == pytest.approx((0.9 / 9 + 1.9 / 19) / 2)
    assert s.acceptance_rate is None and s.acceptance_source is None


def test_acceptance_pools_the_requests_own_fields_without_metrics():
    a = SpecStats("vllm", drafted=8, accepted=4, steps=2, per_step_accepted=(4, 0), per_step_drafted=(4, 4))
    b = SpecStats("vllm", drafted=4, accepted=4, steps=1, per_step_accepted=(4,), per_step_drafted=(4,))
    s = summarize("speculative", 1, [reply(spec=a), reply(spec=b)], wall_s=1.0)
    assert s.acceptance_rate == pytest.approx(8 / 12)  # pooled, not the mean of 0.5 and 1.0
    assert s.mean_accepted_length == pytest.approx(1 + 8 / 3)
    assert s.per_position_acceptance == pytest.approx((2 / 3,) * 4)
    assert s.acceptance_source == "requests"


def test_acceptance_prefers_the_servers_metrics_delta():
    delta = Counters(drafts=10, draft_tokens=40, accepted_tokens=30, accepted_per_position=(9, 8, 7, 6))
    s = summarize("speculative", 1, [reply(spec=SpecStats("vllm", drafted=4, accepted=0))], 1.0, counters=delta)
    assert (s.acceptance_rate, s.mean_accepted_length, s.acceptance_source) == (0.75, 4.0, "metrics")
    assert s.per_position_acceptance == (0.9, 0.8, 0.7, 0.6)


def test_crossover_interpolates_in_log_concurrency():
    levels = [(1, 200, 100), (2, 300, 200), (4, 300, 400), (8, 200, 400)]  # ratios 2, 1.5, 0.75, 0.5
    x = crossover(levels)
    # ratio linear in log c between 2 and 4: 1.5 - (0.75) * t = 1 at t = 2/3, so c = 2 ** (1 + 2/3)
    assert x.concurrency == pytest.approx(2 ** (5 / 3)) and (x.below, x.above) == (2, 4)
    assert x.crossings == 1 and "near 3.2" in x.reason
    assert policy_threshold(levels, x) == 4


def test_crossover_between_the_first_two_levels_and_at_the_first_itself():
    x = crossover([(1, 120, 100), (2, 80, 100)])  # ratios 1.2, 0.8: halfway in log c
    assert x.concurrency == pytest.approx(math.sqrt(2)) and (x.below, x.above) == (1, 2)
    at_first = crossover([(1, 100, 100), (2, 80, 100)])  # exactly 1 at concurrency 1
    assert at_first.concurrency == pytest.approx(1.0)
    assert policy_threshold([(1, 100, 100), (2, 80, 100)], at_first) == 1  # a tie goes to no speculation


def test_no_crossover_when_speculation_always_pays_or_never_does():
    always = [(1, 300, 100), (2, 250, 150), (4, 220, 200)]
    x = crossover(always)
    assert x.concurrency is None and "paid at every level measured" in x.reason
    assert policy_threshold(always, x) is None
    never = [(1, 90, 100), (2, 80, 100)]
    y = crossover(never)
    assert y.concurrency is None and "did not pay at the lowest level" in y.reason
    assert policy_threshold(never, y) == 1
    assert crossover([]).concurrency is None
    assert crossover([(1, 0, 0), (2, 0, 100)]).reason == "no level where both arms produced tokens"


def test_policy_gains_over_always_on_and_always_off():
    levels = [(1, 120, 100), (2, 150, 160)]
    p = toggle_policy(levels, policy_threshold(levels, crossover(levels)))
    assert p["threshold"] == 2 and p["rule"] == "speculate below concurrency 2"
    assert [r["speculate"] for r in p["levels"]] == [True, False]
    assert [r["tokens_per_s"] for r in p["levels"]] == [120, 160]
    assert p["levels"][0]["gain_over_always_off"] == pytest.approx(0.2)
    assert p["levels"][1]["gain_over_always_on"] == pytest.approx(160 / 150 - 1)
    # each level weighted equally: means 140 (policy), 135 (on), 130 (off)
    assert p["gain_over_always_on"] == pytest.approx(140 / 135 - 1)
    assert p["gain_over_always_off"] == pytest.approx(140 / 130 - 1)
    assert "equally" in p["weighting"]
    on = toggle_policy(levels, None)
    assert on["gain_over_always_on"] == 0 and on["rule"] == "speculate at every level measured"


# -- the closed loop --------------------------------------------------------------------------

def test_a_level_keeps_exactly_c_requests_in_flight_and_sends_n():
    server = FakeServer(delay=0.02)
    runs, wall, starts, most = run_level(lambda p: server(SPEC, p), ["a", "b", "c"], 4, 12, deadline=float("inf"))
    assert len(runs) == 12 and len(server.calls) == 12
    assert server.most == 4 and most == 4
    assert [p for _, p in server.calls].count("a") == 4  # prompts taken in turn
    assert wall >= 3 * 0.02 and len(starts) == 12


def test_failed_and_raising_requests_are_counted_not_fatal():
    server = FakeServer(fail=lambda n: "raise" if n == 1 else n % 3 == 0)
    runs, *_ = run_level(lambda p: server(SPEC, p), ["a"], 2, 9, deadline=float("inf"))
    assert len(runs) == 9
    assert sum(r.error is not None for r in runs) == 4  # calls 0, 3, 6 fail; call 1 raised
    assert any(r.error == "RuntimeError: connection reset" for r in runs)


def test_sweep_interleaves_arms_and_alternates_the_order():
    server = FakeServer()
    result = sweep(config(), request=server, read_counters=lambda url: None)
    assert [(a.arm, a.concurrency) for a in result.arms] == [
        ("baseline", 1), ("speculative", 1), ("speculative", 2), ("baseline", 2), ("baseline", 4), ("speculative", 4)]
    urls = [u for u, _ in server.calls]
    assert urls == [BASE] * 8 + [SPEC] * 16 + [BASE] * 16 + [SPEC] * 8
    assert all(len(a.runs) == 8 and not a.partial for a in result.arms)
    assert not result.stopped_early and result.notes == []


def test_sweep_reads_metrics_around_each_speculative_level_only():
    reads = []
    totals = iter([Counters(0, 0, 0, (0, 0)), Counters(10, 40, 20, (8, 6)), Counters(10, 40, 20, (8, 6)),
                   Counters(30, 120, 40, (14, 10))])

    def read(url):
        reads.append(url)
        return next(totals)

    result = sweep(config(concurrency=(1, 2)), request=FakeServer(), read_counters=read)
    assert reads == [SPEC] * 4
    spec = {a.concurrency: a.counters for a in result.arms if a.arm == "speculative"}
    assert spec[1] == Counters(10, 40, 20, (8, 6)) and spec[2] == Counters(20, 80, 20, (6, 4))
    assert all(a.counters is None for a in result.arms if a.arm == "baseline")


def test_max_minutes_stops_issuing_and_marks_the_level_partial():
    clock = Clock()
    server = FakeServer(clock=clock, step=60.0)  # each request takes a simulated minute
    result = sweep(config(max_minutes=2.5, concurrency=(1, 2)), request=server, read_counters=lambda u: None,
                   clock=clock)
    assert len(server.calls) == 3  # sent at minutes 0, 1, 2; at 3 the bound had passed
    assert [(a.arm, a.concurrency, len(a.runs), a.partial) for a in result.arms] == [("baseline", 1, 3, True)]
    assert result.stopped_early and "levels not fully measured: 1, 2" in result.notes[0]


def test_warm_up_that_never_gets_an_answer_stops_the_sweep():
    with pytest.raises(SpecvizError, match="no answer from"):
        sweep(config(warmup=2), request=FakeServer(fail=lambda n: True), read_counters=lambda u: None)


def test_progress_reports_each_request_and_each_level():
    seen = []
    sweep(config(concurrency=(1,), requests=3), request=FakeServer(), read_counters=lambda u: None,
          progress=lambda arm, c, done, n, stats: seen.append((arm, done, stats is not None)))
    assert seen == [("baseline", 1, False), ("baseline", 2, False), ("baseline", 3, False), ("baseline", 3, True),
                    ("speculative", 1, False), ("speculative", 2, False), ("speculative", 3, False),
                    ("speculative", 3, True)]


# -- configuration ----------------------------------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    ({"server": "http://10.1.2.3:8000"}, "not on this machine"),
    ({"server": "http://example.com"}, "--allow-remote"),
    ({"baseline_server": "ftp://127.0.0.1"}, "http"),
    ({"baseline_server": SPEC + "/"}, "same URL"),
    ({"baseline_server": SPEC + "/v1"}, "same URL"),
    ({"concurrency": (0, 2)}, "1 to 256"),
    ({"concurrency": (1, 512)}, "1 to 256"),
    ({"concurrency": (4, 2)}, "ascending"),
    ({"requests": 0}, "1 to 10,000"),
    ({"requests": 10_001}, "1 to 10,000"),
    ({"requests": 2}, "below concurrency 4"),
    ({"max_minutes": 0}, "--max-minutes"),
])
def test_config_refuses_with_a_sentence(kw, message):
    with pytest.raises(SpecvizError, match=message):
        config(**kw)


def test_loopback_hosts_and_remote_when_allowed():
    for host in ("127.0.0.1", "127.3.2.1", "localhost", "[::1]"):
        config(server=f"http://{host}:9000")
    config(server="http://10.1.2.3:8000", allow_remote=True)
    assert prometheus.metrics_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/metrics"


def test_conversations_are_sent_as_chat_messages(monkeypatch):
    from specviz.serving import client

    prompts = load.suite_prompts("default")
    assert any(isinstance(p, str) for p in prompts)
    conversation = next(p for p in prompts if not isinstance(p, str))  # the suite has multi-turn chats
    assert len(conversation) > 1 and conversation[-1][0] == "user"
    sent = []
    monkeypatch.setattr(client, "stream_completion", lambda url, prompt, **kw: sent.append((prompt, kw)))
    load._stream_completion("http://127.0.0.1:1", "hi", max_tokens=4)
    load._stream_completion("http://127.0.0.1:1", (("user", "a plan"), ("assistant", "Day 1"), ("user", "as a list")))
    assert sent[0] == ("hi", {"max_tokens": 4})
    assert sent[1] == ("as a list", {"messages": [{"role": "user", "content": "a plan"},
                                                  {"role": "assistant", "content": "Day 1"},
                                                  {"role": "user", "content": "as a list"}]})


# -- the record, the figure, the table --------------------------------------------------------

def made_result() -> LoadResult:
    """Throughputs with ratios 2, 1.5, 0.75, 0.5 at concurrency 1, 2, 4, 8 (10 tokens a request)."""
    tps = {1: (200, 100), 2: (300, 200), 4: (300, 400), 8: (200, 400)}
    arms = []
    for c, (spec, base) in tps.items():
        arms.append(ArmRun("speculative", c, [reply(spec=SpecStats("vllm", 8, 4, 2))] * 4, 40 / spec))
        arms.append(ArmRun("baseline", c, [reply()] * 4, 40 / base, starts_s=[0.0, 0.1, 0.2, 0.3]))
    return LoadResult(config(concurrency=(1, 2, 4, 8)), arms, "2025-01-01T00:00:00+00:00", "2025-01-01T00:05:00+00:00")


def test_document_round_trips_through_json(tmp_path):
    doc = load_report.document(made_result())
    assert (doc["schema"], doc["version"]) == ("specviz-load", 1)
    assert doc["crossover"]["concurrency"] == pytest.approx(2 ** (5 / 3))
    assert doc["policy"]["threshold"] == 4
    assert doc["levels"][0]["speculative"]["tokens_per_s"] == pytest.approx(200)
    assert doc["config"]["prompts"] == 3 and len(doc["requests"]) == 4 * 2 * 4
    assert [r["sent_s"] for r in doc["requests"][:8]] == [None] * 4 + [0.0, 0.1, 0.2, 0.3]
    path = tmp_path / "load.json"
    load_report.write_json(doc, str(path))
    back = load_report.read_json(str(path))
    assert back == json.loads(json.dumps(doc))
    stats = load_report.arm_stats(back, "speculative")
    assert stats[0] == ArmStats.from_dict(doc["levels"][0]["speculative"])
    assert stats[0].acceptance_rate == 0.5
    (tmp_path / "other.json").write_text('{"schema": "specviz.bench/1"}')
    with pytest.raises(SpecvizError, match="not a specviz load sweep"):
        load_report.read_json(str(tmp_path / "other.json"))


def test_a_busy_machine_gets_a_note():
    busy = load_report.busy_notes({"load_average_before": 3.0, "load_average_after": 9.0, "cpus": 4})
    assert busy and "3.0 on 4 CPUs" in busy[0]
    assert load_report.busy_notes({"load_average_before": 0.4, "load_average_after": 9.0, "cpus": 2}) == []
    assert load_report.busy_notes({"load_average_before": None, "load_average_after": None, "cpus": 2}) == []


def test_figure_draws_both_arms_latencies_acceptance_and_the_crossover():
    fig = load_report.load_figure(made_result())
    names = {t.name for t in fig.data}
    for arm in ("baseline", "speculative"):
        assert {f"{arm} tokens/s", f"{arm} TTFT p50", f"{arm} TTFT p95", f"{arm} inter-token p50",
                f"{arm} inter-token p95"} <= names
    # The crossover is interpolated; the policy switches at a measured level: the legend says both.
    assert {"acceptance rate (alpha)", "crossover ~3.2 (estimated between measured 2 and 4)",
            "policy: speculate at measured levels up to 2, not from 4 (the first measured level past the crossover)"
            } <= names
    crossing = next(t for t in fig.data if t.name.startswith("crossover"))
    assert list(crossing.x) == pytest.approx([2 ** (5 / 3)] * 2)
    assert fig.layout.xaxis.type == "log"


def test_table_and_offline_html(tmp_path):
    doc = load_report.document(made_result())
    text = load_report.table(doc)
    assert "crossover: speculative/baseline throughput falls from 1.50 at concurrency 2" in text
    assert "policy: speculate below concurrency 4" in text and "over always-on" in text
    path = tmp_path / "load.html"
    load_report.write_html(doc, str(path))
    page = path.read_text()
    assert "<script src=" not in page and "Plotly.newPlot" in page  # plotly.js inlined: works offline


# -- the command line -------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--server", "http://192.168.1.4:8000"], "--allow-remote"),
    (["--concurrency", "1,two"], "takes integers"),
    (["--concurrency", "1,300"], "1 to 256"),
    (["--requests", "0"], "1 to 10,000"),
])
def test_cli_refuses_bad_input_in_one_sentence(args, message, capsys):
    argv = ["load", "--server", SPEC, "--baseline-server", BASE, *args]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_writes_json_html_and_prints_the_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(load, "_stream_completion", FakeServer())
    monkeypatch.setattr(prometheus, "read_spec_counters", lambda url: None)
    monkeypatch.setattr(load, "suite_prompts", lambda suite: ("one", "two"))
    argv = ["load", "--server", SPEC, "--baseline-server", BASE, "--model", "m", "--concurrency", "2,1",
            "--requests", "2", "--warmup", "0", "--out", str(tmp_path), "--no-progress"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "crossover:" in out and "speculative" in out
    doc = load_report.read_json(str(tmp_path / "load.json"))
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2] and doc["config"]["model"] == "m"
    assert (tmp_path / "load.html").stat().st_size > 1_000_000  # plotly.js inside
