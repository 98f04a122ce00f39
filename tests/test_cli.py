"""`python -m specviz generate`: the flags scripts rely on, JSON output, and clear errors."""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from dataclasses import fields
from types import SimpleNamespace

import pytest

from specviz.cli import main as cli, terminal
from specviz.cli.main import main
from specviz.core.events import StepEvent
from specviz.core.sampling import Sampling
from specviz.engine.generate import GenerationConfig
from specviz.modeling import models
from specviz.run.spec import parse
from tiny_folder import make_tiny_model_dir


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    return {
        "target": make_tiny_model_dir(root / "target", seed=0),
        "draft": make_tiny_model_dir(root / "draft", seed=1),
        "other": make_tiny_model_dir(root / "other", vocab_words=("zebra", "quokka", "yak"), style="metaspace"),
    }


def run_json(capsys, *args):
    code = main(["generate", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("drafter", ["none", "pld", "draft"])
def test_json_has_what_scripts_read(capsys, folders, drafter):
    spec = str(folders["draft"]) if drafter == "draft" else drafter
    r = run_json(capsys, "--prompt", "the cat sat on the mat", "--target", str(folders["target"]),
                 "--drafter", spec, "--k", "3", "--max-new-tokens", "24")
    assert r["identical_to_baseline"] is True
    assert r["token_ids"] == r["baseline"]["token_ids"] and r["text"] == r["baseline"]["text"]
    assert (r["drafter"], r["label"]) == (spec, parse(spec).label)  # the app's name for it: "prompt lookup"
    assert set(r["stats"]) >= {"acceptance_rate", "mean_accepted_length", "drafted", "accepted",
                               "target_calls", "tokens_per_s"}
    assert r["stats"]["tokens"] == len(r["token_ids"]) > 0
    assert sum(len(s["emitted"]) for s in r["steps"]) == len(r["token_ids"])
    assert r["baseline"]["tokens_per_s"] > 0
    cost = r["verify_cost"]  # the target's measured verify-cost curve, once per model
    assert cost["sizes"] == [1, 2, 4, 8, 16, 32] and len(cost["seconds"]) == 6 and cost["relative"][0] == 1.0
    assert cost["weight_bytes"] > 0 and all(t > 0 for t in cost["seconds"])


@pytest.mark.parametrize("controller", ["llama-pmin:p=0.3", "sglang-adaptive"])
def test_a_controller_sizes_the_drafts_and_greedy_text_stays_the_baselines(capsys, folders, controller):
    r = run_json(capsys, "--prompt", "the cat sat on the mat", "--target", str(folders["target"]),
                 "--drafter", str(folders["draft"]), "--controller", controller, "--max-new-tokens", "24",
                 "--no-baseline")
    assert r["config"]["controller"] == controller and r["label"].endswith(controller)
    drafts = [len(s["draft"]) for s in r["steps"]]
    if controller == "sglang-adaptive":
        assert max(drafts) == 3  # its start tier through warm-up (a drafter may stop sooner: at an end token)
    r2 = run_json(capsys, "--prompt", "the cat sat on the mat", "--target", str(folders["target"]),
                  "--drafter", str(folders["draft"]), "--max-new-tokens", "24", "--no-baseline")
    assert r["token_ids"] == r2["token_ids"]


def test_suffix_memory_file_carries_answers_across_commands(capsys, folders, tmp_path):
    """`--suffix-memory FILE`: the first command's answer is saved, the second drafts from it."""
    memory = tmp_path / "memory.json"
    args = ["--prompt", "the cat sat on the mat", "--target", str(folders["target"]), "--drafter", "suffix",
            "--k", "4", "--max-new-tokens", "24", "--suffix-memory", str(memory)]
    first = run_json(capsys, *args)
    saved = json.loads(memory.read_text())["sequences"]
    assert len(saved) == 1 and saved[0][-24:] == first["token_ids"]
    again = run_json(capsys, *args)
    assert again["identical_to_baseline"] is True
    assert again["stats"]["accepted"] > first["stats"]["accepted"]
    assert len(json.loads(memory.read_text())["sequences"]) == 2
    memory.write_text("{broken")
    assert main(["generate", *args]) == 2
    assert "not a suffix memory" in capsys.readouterr().err


def test_sampling_flags_and_no_baseline(capsys, folders):
    args = ["--prompt", "hello world", "--target", str(folders["target"]), "--temperature", "0.8",
            "--top-k", "20", "--top-p", "0.9", "--repetition-penalty", "1.1", "--seed", "5",
            "--max-new-tokens", "16", "--no-chat", "--no-baseline"]
    first, again = run_json(capsys, *args), run_json(capsys, *args)
    assert "baseline" not in first and "identical_to_baseline" not in first
    assert first["token_ids"] == again["token_ids"]  # seeded, fixed k: the same text
    assert first["config"]["temperature"] == 0.8 and first["steps"][0]["draws"] is not None
    # Dynamic k follows measured timings, so its draft lengths (and with them how the seeded
    # randomness is used) vary from run to run: same distribution, not the same text.
    dynamic = run_json(capsys, *args, "--dynamic-k")
    assert dynamic["stats"]["tokens"] == len(dynamic["token_ids"]) > 0 and dynamic["steps"][0]["draws"] is not None
    # block verification: the same flags, the rule recorded on the run and every step
    block = run_json(capsys, *args, "--verification", "block")
    assert block["config"]["verification"] == first["config"]["verification"] == "block"  # the default (issue 55)
    token = run_json(capsys, *args, "--verification", "token")
    assert token["config"]["verification"] == "token" and {s["verification"] for s in token["steps"]} == {"token"}
    assert {s["verification"] for s in block["steps"]} == {"block"} and block["steps"][0]["block"] is not None


def test_coloured_text_and_summary(capsys, folders):
    assert main(["generate", "--prompt", "the cat sat", "--target", str(folders["target"]), "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "identical to baseline: yes" in out and "legend" in out
    assert "drafter prompt lookup: " in out  # pld, named as the app names it


def test_flags_start_from_the_engines_defaults():
    args = cli.build_parser().parse_args(["generate", "--prompt", "x"])
    cfg = GenerationConfig()
    assert (args.k, args.dynamic_k, args.draft_confidence, args.max_new_tokens, args.verification) == (
        cfg.k, cfg.dynamic_k, cfg.draft_confidence, cfg.max_new_tokens, cfg.verification)
    assert Sampling(**{f.name: getattr(args, f.name) for f in fields(Sampling)}) == Sampling()


def test_plain_terminal_text_marks_each_token_as_the_page_does(monkeypatch):
    def step(draft, accepted, token, emitted):
        n = len(draft)
        return StepEvent(step=0, position=0, draft=draft, q=None, p=(0.5,) * n, accept_prob=(1.0,) * n, draws=None,
                         accepted=accepted, token=token, token_p=0.9, token_kind="bonus" if accepted == n else "corrected",
                         emitted=emitted, top=(), draft_time=0.0, verify_time=0.0, elapsed=0.0, greedy=True)

    monkeypatch.setattr(models, "token_strings", lambda target, ids: [chr(ord("a") + i) for i in ids])
    monkeypatch.setattr(models, "decode", lambda target, ids: "".join(chr(ord("a") + i) for i in ids))
    out = io.StringIO()  # not a terminal: brackets instead of colours
    target = SimpleNamespace(eos_token_ids=(25,))  # z
    terminal.print_coloured(target, [step((0, 1, 2), 1, 3, (0, 3)),  # a kept, b c rejected, d corrected
                                 step((4, 5), 2, 6, (4, 5, 6)),  # e f kept, g bonus
                                 step((7, 8), 2, 9, (7,))], out)  # cut at EOS after h: i and j never shown
    assert out.getvalue() == "a[-b][-c]~d~ef{g}h\n\n"
    # The end-of-turn token that stops a run is not text; a rejected draft of it still shows.
    out = io.StringIO()
    terminal.print_coloured(target, [step((25, 1), 0, 2, (2,)), step((3,), 1, 25, (3, 25))], out)
    assert out.getvalue() == "[-z][-b]~c~d\n\n"


def test_text_ends_before_the_eos_token_but_token_ids_keep_it(capsys, folders, monkeypatch):
    """Declare a token of the greedy answer (its first new one after the 2nd) an EOS: the run
    stops there, its ids end with it, and neither text nor the printed answer shows it."""
    args = ["--prompt", "the cat sat on the mat", "--target", str(folders["target"]), "--max-new-tokens", "12"]
    ids = run_json(capsys, *args)["token_ids"]
    n = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    monkeypatch.setattr(models.Loaded, "eos_token_ids", property(lambda self: (ids[n],)))
    r = run_json(capsys, *args)
    target = models.load(str(folders["target"]))
    assert r["token_ids"] == ids[:n + 1] and r["baseline"]["token_ids"] == ids[:n + 1]
    assert r["text"] == r["baseline"]["text"] == models.decode(target, ids[:n])
    assert main(["generate", *args]) == 0
    answer = capsys.readouterr().out.split("\n\n")[0]
    shown = "".join(models.token_strings(target, ids[:n]))
    assert re.sub(r"\[-[^]]*\]|[{}~]", "", answer) == shown  # without rejected drafts and marks


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "   "], "prompt is empty"),
        (["--k", "0"], "k must be from 1 to 64, got 0"),
        (["--k", "100000"], "k must be from 1 to 64"),
        (["--temperature", "-1"], "temperature"),
        (["--temperature", "nan"], "temperature"),
        (["--top-p", "0"], "top-p"),
        (["--top-p", "1.5"], "top-p"),
        (["--max-new-tokens", "0"], "max new tokens"),
        (["--target", "/no/such/folder"], "/no/such/folder"),
        (["--target", "no-such-org/no-such-model"], "no-such-org/no-such-model"),
        (["--drafter", "OTHER"], "do not share a tokenizer"),
        (["--prompt", "the cat " * 400], "context"),
        (["--device", "cuda:7"], "cuda"),
        (["--dtype", "float7"], "float7"),
        (["--controller", "sglang-adaptiv"], "unknown controller 'sglang-adaptiv' (did you mean 'sglang-adaptive'?)"),
        (["--controller", "llama-pmin:p=2"], "llama-pmin's p must be from 0 to 1, got 2"),
        (["--controller", "fixed:4", "--dynamic-k"], "leave out --dynamic-k"),
    ],
)
def test_bad_input_is_a_clear_error(capsys, folders, args, message):
    args = [str(folders["other"]) if a == "OTHER" else a for a in args]
    base = ["--prompt", "the cat", "--target", str(folders["target"]), "--max-new-tokens", "4"]
    assert main(["generate", *base, *args]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error: " in line]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err


def test_mismatched_drafter_error_names_both_models(capsys, folders):
    main(["generate", "--prompt", "the cat", "--target", str(folders["target"]), "--drafter", str(folders["other"])])
    err = capsys.readouterr().err
    assert str(folders["target"]) in err and str(folders["other"]) in err


def test_the_real_command_exits_non_zero_without_a_traceback(folders):
    proc = subprocess.run(
        [sys.executable, "-m", "specviz", "generate", "--prompt", "", "--target", str(folders["target"])],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "error: the prompt is empty" in proc.stderr and "Traceback" not in proc.stderr


def test_text_never_ends_in_half_a_character(capsys, folders, monkeypatch):
    """A run cut mid-emoji (the token limit came before its last byte) has no U+FFFD: the
    --json text, the baseline's and the printed answer keep the open character back."""
    from specviz.core.events import RunEnd, RunStats, TokenEvent
    from specviz.run import race as engine  # the race's streams

    target = models.load(str(folders["target"]))
    ids = models.encode_prompt(target, "hi 👋", chat=False)[:-1]
    assert models.decode(target, ids).endswith("\ufffd")
    stats = RunStats(len(ids), len(ids), len(ids) + 1, 0, 0, 0.1, 0.0, 0.1, 0.2, "max_new_tokens")

    def speculative(target_model, drafter, prompt, cfg, should_stop=None, remember=True, on_prefill=None):
        for n, t in enumerate(ids):
            yield StepEvent(step=n, position=n, draft=(), q=None, p=(), accept_prob=(), draws=None, accepted=0,
                            token=t, token_p=0.9, token_kind="bonus", emitted=(t,), top=(), draft_time=0.0,
                            verify_time=0.01, elapsed=0.01 * (n + 1), greedy=True)
        yield RunEnd(tuple(ids), stats)

    def baseline(target_model, prompt, cfg, should_stop=None, on_prefill=None):
        for n, t in enumerate(ids):
            yield TokenEvent(step=n, token=t, p=0.9, time=0.01, elapsed=0.01 * (n + 1))
        yield RunEnd(tuple(ids), stats)

    monkeypatch.setattr(engine, "speculative_generate", speculative)
    monkeypatch.setattr(engine, "baseline_generate", baseline)
    args = ["--prompt", "say hi", "--target", str(folders["target"]), "--drafter", "none"]
    r = run_json(capsys, *args)
    assert r["text"] == r["baseline"]["text"] == "hi "
    assert main(["generate", *args]) == 0
    assert "\ufffd" not in capsys.readouterr().out


def test_the_command_line_loads_neither_plotly_nor_gradio():
    # Training and generating run on machines with only torch and transformers (a bare GPU box).
    import subprocess
    import sys

    code = "import sys, specviz.cli.main; print(sorted({'plotly', 'gradio'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_loads_progress_is_a_line_per_new_message_for_every_command(capsys):
    """generate, bench, train and audit print a model's load (and the embedded model's conversion) alike."""
    from specviz.run.prepare import on_stderr

    progress = on_stderr()
    for message in ("converting", "converting", "loading"):
        progress(message, 0.5)
    assert capsys.readouterr().err == "converting ...\nloading ...\n"
