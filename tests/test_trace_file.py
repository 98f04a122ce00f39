"""Export and replay: what a step records, a saved run read back unchanged, bad files refused
in one sentence, and the CLI's `--trace` / `replay` pair printing the same run."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
from app_server import PROMPT, app_models  # noqa: F401 (app_models is a fixture)

from specviz.cli.main import main
from specviz.core.events import RunEnd
from specviz.core.sampling import Sampling
from specviz.run.spec import make_drafter, parse
from specviz.engine.generate import GenerationConfig, baseline_generate, speculative_generate
from specviz.engine.interleave import interleave
from specviz.engine.verify_cost import VerifyCurve
from specviz.modeling import models
from specviz.render.trace import Trace
from specviz.run import replay
from specviz.traces import trace_file
from specviz.traces.labels import Labeler
from specviz.traces.trace_file import Recording, RunInfo, TraceFileError


def record(folders, temperature=0.0, tokens=24, verification=GenerationConfig.verification) -> tuple[Recording, list[str]]:
    """A live run of the tiny target and its noisy draft model, labelled as the app labels it;
    also the order its events came in."""
    target, draft = models.load(folders["target"]), models.load(folders["draft"])
    ids = models.encode_prompt(target, PROMPT)
    cfg = GenerationConfig(max_new_tokens=tokens, k=4, sampling=Sampling(temperature=temperature),
                           eos_token_ids=target.eos_token_ids, verification=verification)
    traces = {"spec": Trace("tiny draft", k=4), "base": Trace("baseline", speculative=False)}
    labelers = {w: Labeler(models, target, ids) for w in traces}
    order = []
    drafter = make_drafter(folders["draft"], target, draft=draft)
    for which, ev in interleave(speculative_generate(target.model, drafter, ids, cfg),
                                baseline_generate(target.model, ids, cfg)):
        traces[which].add(ev, None if isinstance(ev, RunEnd) else labelers[which].label(ev))
        order.append(which)
    info = RunInfo(target=folders["target"], drafter=folders["draft"], prompt=PROMPT, greedy=temperature == 0,
                   config={"k": 4}, source="test")
    return Recording(info, traces["spec"], traces["base"]), order


@pytest.fixture(scope="module")
def sampled(app_models):  # noqa: F811
    # token-wise: this seed's run has a rejection to draw from (the block keeps every draft of it)
    return record(app_models, temperature=0.9, verification="token")


def test_a_step_records_p_and_q_at_every_position_and_the_baseline_its_top(sampled):
    rec, _ = sampled
    for e in rec.spec.steps:
        n = len(e.draft)
        assert len(e.p_top) == n + 1 and len(e.q_top) == n  # every draft position, then the bonus position
        assert e.top == e.p_top[e.accepted]  # where the step's own token was drawn
        for i, d in enumerate(e.draft):
            assert dict(e.p_top[i]).get(d, e.p[i]) == pytest.approx(e.p[i])  # the same p, where it is in the top
            assert dict(e.q_top[i]).get(d, e.q[i]) == pytest.approx(e.q[i])
        for row in (*e.p_top, *e.q_top):
            probs = [p for _, p in row]
            assert len(row) == 5 and probs == sorted(probs, reverse=True)
    assert any(e.draws and e.accepted < len(e.draft) for e in rec.spec.steps)  # a rejection to draw
    base = rec.base.events
    assert all(len(e.top) == 5 and e.top[0][1] >= e.p for e in base)


def test_a_loaded_trace_keeps_one_copy_of_each_token_text(sampled, tmp_path):
    """Each step records the top tokens' texts at every position (p_top, q_top and the 32-token raw
    rows): the same few thousand texts over and over, each its own object as JSON reads them. Loaded,
    equal texts are one object (a 10 MB trace at the app's cap held 56 MB in Python, now 42)."""
    path = tmp_path / "run.json"
    trace_file.save(path, sampled[0])
    back = trace_file.load(path)
    texts = [t for labels in back.spec.labels for rows in (labels.p_top, labels.q_top, labels.p_raw, labels.q_raw)
             for row in rows for t in row]
    assert len(texts) > 2 * len(set(texts))  # they do repeat
    assert len({id(t) for t in texts}) == len(set(texts))


def test_a_saved_run_loads_back_event_for_event(sampled, tmp_path):
    rec, order = sampled
    path = tmp_path / "run.json"
    trace_file.save(path, rec)
    back = trace_file.load(path)
    for run, again in ((rec.spec, back.spec), (rec.base, back.base)):
        assert again.events == run.events and again.labels == run.labels and again.end == run.end
        assert (again.label, again.k, again.speculative) == (run.label, run.k, run.speculative)
    assert back.info.prompt == PROMPT and back.info.created  # saving dates it
    assert [w for w, _, _ in replay.in_order(back)] == order  # the order the live run showed them in
    times = [t for t, _ in replay.race(back)]
    assert times == sorted(times) and len(times) == len(order)
    spec, base = replay.after_steps(back, 2)
    assert len(spec.steps) == 2 and len(base.token_ids) == len(spec.token_ids)  # the baseline keeps pace
    spec, base = replay.after_steps(back, 10 ** 6)
    assert spec.end == rec.spec.end and base.end == rec.base.end


def good_doc(sampled) -> dict:
    return json.loads(trace_file.dumps(sampled[0]))


def damaged(doc):
    step = doc["runs"][0]["events"][0]
    step["accepted"] = len(step["draft"]) + 1
    return json.dumps(doc)


def edited(path: str, value):
    """The good trace with one value changed: `path` is "spec.0.p.0" (run, event, field, index) or
    "spec.end.tokens" (run, its end's statistics)."""
    def make(doc):
        role, *keys = path.split(".")
        node = doc["runs"][0 if role == "spec" else 1]
        node = node["end"]["stats"] if keys[0] == "end" else node["events"][int(keys.pop(0))]
        keys = keys[1:] if keys[0] == "end" else keys
        for key in keys[:-1]:
            node = node[int(key) if isinstance(node, list) else key]
        last = keys[-1]
        node[int(last) if isinstance(node, list) else last] = value
        return json.dumps(doc)
    return make


def flipped_kind(doc) -> str:
    """The first step that rejected a draft, called a bonus."""
    step = next(e for e in doc["runs"][0]["events"] if e["token_kind"] == "corrected")
    step["token_kind"] = "bonus"
    return json.dumps(doc)


# The laws a trace's numbers obey (docs/app.md promises an edited file is refused in one sentence):
# p = 7.5 replayed with "p (target) 7.500" in the inspector; negative times re-timed a 2.98x GPU run as 0.74x.
LAWS = [
    (edited("spec.0.p.0", 7.5), "speculative event 1 is damaged: its p holds 7.5, and a probability is between 0 and 1"),
    (edited("spec.0.draws.0", -0.2), "its draws u holds -0.2"),
    (edited("spec.0.top.0.1", 1.5), "its top holds 1.5"),
    (edited("spec.0.draft_time", -0.01), "speculative event 1 is damaged: its draft time is -0.01 s, and no time is negative"),
    (edited("base.0.time", -1.0), "baseline event 1 is damaged: its time is -1 s"),
    (edited("spec.0.emitted.0", 3), "its output is not the accepted drafts followed by its own token"),
    (edited("spec.end.tokens", 999), "the speculative run's statistics do not add up: it counts 999 tokens"),
    (edited("spec.end.steps", 1), "the speculative run's statistics do not add up: it counts 1 steps"),
    (edited("base.end.verify_time", -3.0), "the baseline run's statistics do not add up: its verify time is negative"),
    # Issue 66: these loaded, and a replay would have waited out 1e12 s or numbered a step 1,000,000,001
    (edited("spec.1.step", 0), "speculative event 2 is damaged: its step number is 0 where it is the run's event 2"),
    (edited("spec.-1.step", 10**9), "its step number is 1,000,000,000 where it is the run's event"),
    (edited("base.2.step", 1), "baseline event 3 is damaged: its step number is 1"),
    (edited("spec.-1.elapsed", 1e12), "its elapsed time is 1e+12 s, more than a week"),
    (edited("base.end.elapsed", 1e12), "the baseline run's statistics do not add up: its elapsed time is 1e+12 s"),
    (edited("spec.1.elapsed", 0.0), "its elapsed time is 0 s, before the event before it"),
    (edited("spec.end.elapsed", 0.0), "its elapsed time 0 s ends before its last event's"),
    (edited("spec.1.position", 0), "speculative event 2 is damaged: it starts at token 0, where the steps before it"),
    (lambda doc: flipped_kind(doc), "is damaged: it is a bonus step with"),
    (edited("spec.0.top.1.1", 0.9), "its top probabilities sum to"),
    (edited("spec.0.p_top.0.0.1", 1.2), "its p_top holds 1.2"),
]


def shortened(path: str):
    """The good trace with the last item of one list dropped: `path` is "spec.0.draws" (run, event, keys)."""
    def make(doc):
        role, index, *keys = path.split(".")
        node = doc["runs"][0 if role == "spec" else 1]["events"][int(index)]
        for key in keys:
            node = node[int(key) if isinstance(node, list) else key]
        node.pop()
        return json.dumps(doc)
    return make


# The shapes the renderers rely on (trace_file._check): each refused with its own sentence
SHAPES = [
    (edited("base.0.token", -1), "baseline event 1 is damaged: a negative token id"),
    (shortened("spec.0.draws"), "speculative event 1 is damaged: its q or draws do not match its draft"),
    (shortened("spec.0.p_top"), "speculative event 1 is damaged: its top-k rows do not match its draft"),
    (edited("spec.0.token_kind", "lucky"), "speculative event 1 is damaged: its token kind or ids are invalid"),
    (edited("spec.0.draft.0", 2**31), "speculative event 1 is damaged: a token id is above 2147483647"),
    (edited("spec.0.verification", "vibes"), "speculative event 1 is damaged: its verification rule 'vibes' is unknown"),
    (shortened("spec.0.text.top"), "speculative event 1 is damaged: its top texts do not match its top tokens"),
    (shortened("spec.0.text.p_top.0"), "speculative event 1 is damaged: its p_top texts do not match its p_top tokens"),
]


@pytest.mark.parametrize("make, words", LAWS + SHAPES)
def test_a_file_that_breaks_a_law_of_its_numbers_is_refused_in_one_sentence(sampled, make, words):
    with pytest.raises(TraceFileError) as info:
        trace_file.loads(make(good_doc(sampled)))
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_file_with_more_steps_than_the_apps_token_cap_is_refused(sampled):
    """A 10,000-step trace took the server from 2.5 GB to 6.3 GB and froze the tab on Play; no run
    this app makes has more steps than its token cap (each step outputs a token at least)."""
    text = trace_file.dumps(sampled[0])
    tokens = len(sampled[0].base.events)  # 24: the baseline's tokens, more than the speculative run's steps
    assert trace_file.loads(text, max_steps=tokens).spec.events == sampled[0].spec.events
    with pytest.raises(TraceFileError, match=rf"^the baseline run has {tokens} tokens, more than the "
                                             rf"{tokens - 1} new tokens this app allows a run$"):
        trace_file.loads(text, max_steps=tokens - 1)


@pytest.mark.parametrize("make, words", [
    (lambda doc: json.dumps(doc)[:5000], "not valid JSON"),
    (lambda doc: "[1, 2, 3]", "not a specviz trace"),
    (lambda doc: json.dumps({**doc, "format": "something-else"}), "not a specviz trace"),
    (lambda doc: json.dumps({**doc, "version": 99}), "newer specviz"),
    (lambda doc: json.dumps({**doc, "runs": []}), "no runs"),
    (lambda doc: json.dumps({**doc, "runs": doc["runs"] * 2}), "the trace holds 4 runs, where a trace holds"),
    (damaged, "speculative event 1 is damaged"),
    (lambda doc: json.dumps(doc).replace('"p_top": [[[', '"p_top": [["x", [', 1), "should be a list"),
    (lambda doc: "[" * 100_000, "not a specviz trace"),
    (lambda doc: "[" * 100_000 + "]" * 100_000, "nested thousands of levels deep"),
    (lambda doc: json.dumps(doc).replace('"version": 1', '"version": ' + "9" * 5000, 1), "a whole number of 5000 digits"),
    (lambda doc: json.dumps(doc).replace('"elapsed":', '"elapsed":1e999999,"x":', 1), "the number 1e999999"),
    (lambda doc: json.dumps(doc).replace('"token":', '"token":' + "7" * 401 + ',"x":', 1), "401 digits"),
    (lambda doc: json.dumps(doc).replace('"token":', '"token":' + str(2**40) + ',"x":', 1), "token id"),
    # what the renderers rely on beyond types: lengths that agree with the draft, ids in range, texts one per token
    (edited("spec.0.draws", [0.5]), "speculative event 1 is damaged: its q or draws do not match its draft"),
    (edited("spec.0.p_top", [[]]), "speculative event 1 is damaged: its top-k rows do not match its draft"),
    (edited("spec.0.token_kind", "guessed"), "speculative event 1 is damaged: its token kind or ids are invalid"),
    (edited("spec.0.draft.0", 2**31), "speculative event 1 is damaged: a token id is above 2147483647, more than"),
    (edited("spec.0.block.weight", [1.0]), "speculative event 1 is damaged: its block verification does not match"),
    (edited("spec.0.verification", "guess"), "event 1 is damaged: its verification rule 'guess' is unknown"),
    (edited("base.0.token", -1), "baseline event 1 is damaged: a negative token id"),
    (edited("base.0.token", 2**31), "baseline event 1 is damaged: a token id above 2147483647, more than any"),
    (edited("spec.0.text.top", ["x"]), "speculative event 1 is damaged: its top texts do not match its top tokens"),
    (edited("spec.0.text.q_raw", [["x"]] * 4), "event 1 is damaged: its q_raw texts do not match its q_raw tokens"),
    (edited("spec.0.p_raw.0.0.1", 0.5), "speculative event 1 is damaged: a log-probability in its p_raw is above 0, "
                                        "so its probability is above 1"),
])
def test_a_bad_file_is_refused_in_one_sentence(sampled, make, words):
    with pytest.raises(TraceFileError) as info:
        trace_file.loads(make(good_doc(sampled)))
    assert words in str(info.value) and "\n" not in str(info.value)
    assert "sys." not in str(info.value) and "got float" not in str(info.value)  # Python's words, not ours


H200 = VerifyCurve(sizes=(1, 2, 4, 8, 16, 32), seconds=(0.004, 0.004, 0.0041, 0.0042, 0.0044, 0.006),
                   weight_bytes=16_000_000_000, device="cuda:0", dtype="bfloat16")


def test_the_verify_cost_curve_travels_with_the_run_and_older_files_still_load(sampled):
    rec, _ = sampled
    back = trace_file.loads(trace_file.dumps(dataclasses.replace(rec, curve=H200)))
    assert back.curve == H200 and back.curve.cost(5) == pytest.approx(H200.cost(5))
    doc = good_doc(sampled)  # a file written before curves were kept
    assert "verify_cost" not in doc and trace_file.loads(json.dumps(doc)).curve is None


def with_curve(doc, **change):
    return json.dumps({**doc, "verify_cost": {**dataclasses.asdict(H200), **change}})


@pytest.mark.parametrize("change, words", [
    (dict(sizes=[2, 4, 8], seconds=[1.0, 1.0, 1.0]), "do not start at one token"),
    (dict(sizes=[1, 4, 2, 8, 16, 32]), "do not ascend"),
    (dict(seconds=[0.004, 0.0]), "disagree in length"),
    (dict(seconds=[0.004, 0.004, 0.0, 0.004, 0.004, 0.004]), "a time is not positive"),
    (dict(sizes=list(range(1, 200)), seconds=[1.0] * 199), "199 sizes"),
    (dict(sizes=[]), "has no sizes"),
    (dict(weight_bytes="lots"), "should be int"),
])
def test_a_damaged_curve_is_refused_in_one_sentence(sampled, change, words):
    with pytest.raises(TraceFileError) as info:
        trace_file.loads(with_curve(good_doc(sampled), **change))
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_file_over_the_size_limit_is_not_read(sampled, tmp_path):
    path = tmp_path / "big.json"
    path.write_text(" " * 2_000_000 + trace_file.dumps(sampled[0]))
    with pytest.raises(TraceFileError, match=r"big.json is 2\.\d MB: this app replays trace files of up to 1 MB$"):
        trace_file.load(path, max_bytes=1_000_000)


def test_cli_replay_prints_what_generate_printed_with_no_model(app_models, tmp_path, capsys, monkeypatch):  # noqa: F811
    path = tmp_path / "cli.json"
    args = ["--prompt", PROMPT, "--target", app_models["target"], "--drafter", app_models["draft"],
            "--max-new-tokens", "20"]
    assert main(["generate", *args, "--trace", str(path)]) == 0
    generated = capsys.readouterr().out
    curve = trace_file.load(path).curve  # the target's verify cost on the machine that ran it
    assert trace_file.load(path).spec.label == parse(app_models["draft"]).label  # as the app labels its runs
    assert curve is not None and curve.sizes[0] == 1 and curve.weight_bytes > 0
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("replay loaded a model"))
    assert main(["replay", str(path)]) == 0
    assert capsys.readouterr().out == generated  # the same coloured text and the same summary
    assert main(["replay", str(path), "--steps"]) == 0
    lines = re.findall(r"^step \d+ \(\d+ drafted, \d+ kept\): ", capsys.readouterr().out, re.M)
    assert len(lines) == len(trace_file.load(path).spec.steps)
    assert main(["replay", str(path), "--speed", "50"]) == 0
    assert capsys.readouterr().out == generated


def test_cli_replay_of_a_bad_file_says_why_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text('{"format": "specviz-trace", "version": 2')
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: not a specviz trace") and "Traceback" not in err
    assert main(["replay", str(tmp_path / "missing.json")]) == 2
    assert "could not read the trace file" in capsys.readouterr().err



def test_a_tree_step_records_the_target_along_its_chain_view(app_models):  # noqa: F811
    target = models.load(app_models["target"])
    ids = models.encode_prompt(target, PROMPT)
    cfg = GenerationConfig(max_new_tokens=16, k=4, eos_token_ids=target.eos_token_ids)
    steps = [e for e in speculative_generate(target.model, make_drafter(app_models["medusa"], target), ids, cfg)
             if not isinstance(e, RunEnd)]
    trees = [e for e in steps if e.tree is not None]
    assert trees
    for e in trees:
        assert len(e.p_top) == len(e.draft) + 1 and e.q_top == () and e.top == e.p_top[e.accepted]
        for i, d in enumerate(e.draft):
            assert dict(e.p_top[i]).get(d, e.p[i]) == pytest.approx(e.p[i])
