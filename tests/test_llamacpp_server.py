"""specviz against a real llama.cpp server (llama-server on the embedded model's Q4_1 GGUF): n-gram
speculation on and off, read through generate, bench, the Serving tab's handler and a load sweep.

Skipped unless asked for (`python -m pytest --llamacpp -m llamacpp`): the first run builds
llama-server (~9 min on 2 cores, once; scripts/serve-llamacpp.sh --build-only does it ahead).
"""
from __future__ import annotations

import json
from html import unescape

import pytest

from llamacpp_servers import SLOTS, servers
from vllm_servers import ECHO, audit, cli, generated, lane
from specviz.serving.figures import REBUILT
from specviz.serving.steps import COUNTERS

# One worker runs them all (pytest-xdist's loadgroup): the servers start once.
pytestmark = [pytest.mark.llamacpp, pytest.mark.slow, pytest.mark.xdist_group("llamacpp")]

K = 4  # the drafts' length the spec server was started with (llamacpp_servers.SPEC_FLAGS)

urls = lane(servers)


def test_generate_reads_llamacpps_own_counts_and_rebuilds_its_steps(urls):
    # Steps are rebuilt from the running draft counters: one entry per step that drafted.
    out = generated(*urls, "llama.cpp", k=K)
    # llama.cpp streams one chunk per token (a token ending inside a UTF-8 character rides with the next)
    assert all(c["tokens"] in (1, 2, None) for c in out["server"]["chunks"])


def test_generate_prints_rebuilt_steps_as_groups(urls):
    spec, _ = urls
    r = cli("generate", "--server", spec, "--prompt", ECHO, "--max-new-tokens", "32")
    assert r.returncode == 0, r.stderr
    assert "⟨" in r.stdout and "rebuilt from llama.cpp's running draft counters" in r.stdout


def test_a_plain_llamacpp_server_is_told_its_own_flag(urls):
    _, base = urls
    r = cli("generate", "--server", base, "--prompt", "Say hi.", "--max-new-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "This llama.cpp server is not speculating" in r.stdout and "--spec-type" in r.stdout
    assert "--speculative-config" not in r.stdout and "⟨" not in r.stdout


def test_bench_compares_decode_only_rates(urls, tmp_path):
    spec, base = urls
    path = tmp_path / "bench.json"
    r = cli("bench", "--server", spec, "--baseline-server", base, "--category", "code", "--limit", "1",
            "--max-new-tokens", "24", "--repeats", "1", "--json", str(path), "--no-progress")
    assert r.returncode == 0, r.stderr
    doc = json.loads(path.read_text())
    assert {row["category"] for row in doc["summary"]} == {"code", "all"}
    assert {run["arm"] for run in doc["runs"]} == {"spec", "base"}
    assert all(run["decode_tokens_per_s"] > 0 for run in doc["runs"])  # llama.cpp's timings, every run
    assert all(row["rate"] == "decode" for row in doc["summary"])
    assert "decode only" in r.stdout


def test_the_serving_tab_draws_llamacpps_steps(urls):
    """The app's Serving engine handler (what the tab and its /serving API run) on the real servers."""
    from specviz.ui import Policy
    from specviz.ui.handlers import Session
    from specviz.ui.live.limits import Line
    from specviz.ui.blocks.serving import ServingRuns

    spec, base = urls
    policy = Policy()
    runs = ServingRuns(policy, Line(policy.concurrency, policy.max_waiting, policy.runs_per_visitor))
    *_, last = runs.run(Session(), None, server=spec, baseline=base, model="", prompt=ECHO, mode="greedy",
                        temperature=0.0, seed=0, max_new_tokens=48, chat=True)
    summary, panel = last["summary"], unescape(last["spec"]).replace("&#x27;", "'")
    assert summary["state"] == "done", summary["message"]
    s, b = summary["speculative"], summary["baseline"]
    assert s["engine"] == "llama.cpp" and s["steps_from"] == COUNTERS and s["spec"]["drafted"] > 0
    assert s["decode_tokens_per_s"] > 0 and b["decode_tokens_per_s"] > 0
    # one box per rebuilt step: the steps that drafted say what they kept, and the caption says how they were found
    assert panel.count(" drafts · ") == len(s["spec"]["per_step_drafted"]) and REBUILT in panel
    assert "quick brown fox" in s["text"]


def test_a_small_load_sweep_measures_both_arms(urls, tmp_path):
    spec, base = urls
    levels = [1, 2, SLOTS]  # -np SLOTS: no request waits for a free slot
    r = cli("load", "--server", spec, "--baseline-server", base, "--concurrency", ",".join(map(str, levels)),
            "--requests", str(SLOTS), "--max-tokens", "16", "--warmup", "1", "--out", str(tmp_path), "--no-progress")
    assert r.returncode == 0, r.stderr
    from specviz.serving.load_report import read_json

    doc = read_json(tmp_path / "load.json")
    assert [lv["concurrency"] for lv in doc["levels"]] == levels
    for lv in doc["levels"]:
        s, b = lv["speculative"], lv["baseline"]
        assert s["requests"] == b["requests"] == SLOTS and s["failed"] == b["failed"] == 0
        assert s["tokens_per_s"] > 0 and b["tokens_per_s"] > 0
        assert s["acceptance_source"] == "metrics" and b["acceptance_rate"] is None
    assert (tmp_path / "load.html").stat().st_size > 100_000  # plotly inlined: opens offline


def test_the_audit_finds_llamacpps_ngram_sampling_consistent_with_plain_sampling(urls, tmp_path):
    """`python -m specviz audit` on the pair (issue 56): the repeated question gets drafts proposed
    and refused, and the sampled completions of both servers pass the two-sample tests."""
    spec, base = urls
    r, doc = audit(spec, base, tmp_path / "audit.json")
    for result in doc["results"]:
        assert result["drafted"] > result["accepted"] >= 0 and result["speculative"]["engine"] == "llama.cpp"
    assert r.returncode == 0, r.stdout  # not exact: the side-by-side table is in the output
