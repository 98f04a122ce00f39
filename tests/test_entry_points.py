"""The same words give the same run, whichever entry point is asked: `generate --json`, the app's
/generate handler and `bench --json`, on one prompt, greedy and sampled (fixed seed), with EAGLE, Medusa
and prompt lookup. The CLI used to draft k-node trees at temperature 1 where the app drafted chains
(and 2k-node trees where the CLI drafted k), because the tree policy lived in the app alone.

The CLI and the app are compared step by step (each step's draft, how many were kept, its tree's size,
the tokens); the bench records counts per run, so it is compared by those: steps, drafted, accepted,
the nodes verified and how many steps verified each tree size.
"""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from app_server import PROMPT, app_models  # noqa: F401 (app_models is a fixture)

from specviz.cli.main import main
from specviz.modeling import models
from specviz.ui import Policy
from specviz.ui.handlers import Handlers, Session

K, TOKENS, SEED = 3, 12, 5
DRAFTERS = ("eagle", "medusa", "pld")


def _step(draft, accepted, tree, emitted) -> tuple:
    return tuple(draft), accepted, len(tree) if tree else len(draft), tuple(emitted)


def cli_run(folders, drafter: str, temperature: float, capsys) -> tuple[list, list]:
    assert main(["generate", "--json", "--no-baseline", "--prompt", PROMPT, "--target", folders["target"],
                 "--drafter", drafter, "--k", str(K), "--temperature", str(temperature), "--seed", str(SEED),
                 "--max-new-tokens", str(TOKENS)]) == 0
    out = json.loads(capsys.readouterr().out)
    steps = [_step(s["draft"], s["accepted"], s["tree"] and s["tree"]["tokens"], s["emitted"]) for s in out["steps"]]
    return out["token_ids"], steps


def app_run(folders, drafter: str, temperature: float) -> tuple[list, list]:
    handlers, session = Handlers(Policy(), models), Session()
    for _ in handlers.generate(handlers.arm(session), prompt=PROMPT, target=folders["target"], drafter=drafter,
                               k=K, mode="sampling" if temperature else "greedy", temperature=temperature,
                               seed=SEED, max_new_tokens=TOKENS):
        pass
    frame = session.last
    assert frame.state == "done", frame.message
    steps = [_step(s.draft, s.accepted, s.tree and s.tree.tokens, s.emitted) for s in frame.spec.steps]
    return list(frame.spec.token_ids), steps


def bench_runs(folders, names: list[str], temperature: float, tmp_path) -> dict[str, dict]:
    suite, out = tmp_path / "one.jsonl", tmp_path / f"bench-{temperature}.json"
    suite.write_text(json.dumps({"id": "one", "category": "c", "prompt": PROMPT}) + "\n")
    assert main(["bench", "--target", folders["target"], "--drafters", ",".join(names), "--k", str(K),
                 "--temperature", str(temperature), "--seed", str(SEED), "--max-new-tokens", str(TOKENS),
                 "--suite", str(suite), "--json", str(out), "--no-progress"]) == 0
    # sampled arms say the engine's default rule ("eagle k=4 block"), the same generate and the app run
    return {r["arm"].removesuffix(" block").removesuffix(f" k={K}"): r for r in json.loads(out.read_text())["runs"]}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_the_app_and_the_bench_run_the_same_steps_for_the_same_words(app_models, temperature,  # noqa: F811
                                                                              capsys, tmp_path):
    names = {kind: app_models.get(kind, kind) for kind in DRAFTERS}  # the tiny heads' files; pld by name
    benched = bench_runs(app_models, list(names.values()), temperature, tmp_path)
    capsys.readouterr()
    for kind, name in names.items():
        tokens, steps = cli_run(app_models, name, temperature, capsys)
        assert app_run(app_models, name, temperature) == (tokens, steps), f"{kind} at temperature {temperature}"
        b = benched[name]
        nodes = Counter(size for _, _, size, _ in steps)
        assert (b["tokens"], b["steps"], b["drafted"], b["accepted"], b["candidates"]) == (
            len(tokens), len(steps), sum(len(d) for d, *_ in steps), sum(a for _, a, _, _ in steps), sum(nodes.elements()))
        assert b["draft_lengths"] == {str(n): c for n, c in sorted(nodes.items())}, f"{kind} at temperature {temperature}"
        if kind != "pld":  # the tree policy: 2k-node trees greedy, chains when sampling at 1.0
            assert max(nodes) == (2 * K if not temperature else K), nodes


@pytest.mark.parametrize("typo, meant", [("eagel", "eagle"), ("sufix+medusa", "suffix"), ("medusaa+pld", "medusa"),
                                         ("egale", "eagle"), ("Eagle3", "eagle")])
def test_a_mistyped_drafter_is_told_the_drafter_names_not_the_targets_advice(app_models, typo, meant,  # noqa: F811
                                                                              capsys):
    """A close typo is refused before any model loads; a farther one ('egale') is tried as a draft model's
    name and, found nowhere, gets the drafters' sentence with the closest name, not the target's advice."""
    said = (f"unknown drafter '{re.escape(typo)}': (did you mean '{meant}'\\?|no drafter goes by that name.*"
            f"the closest drafter name is '{meant}')\\.? The drafters are 'none', 'pld'")
    assert main(["generate", "--prompt", PROMPT, "--target", app_models["target"], "--drafter", typo]) == 2
    err = capsys.readouterr().err
    assert re.search(said, err) and "embedded" not in err, err
    handlers, session = Handlers(Policy(), models), Session()
    for _ in handlers.generate(handlers.arm(session), prompt=PROMPT, target=app_models["target"], drafter=typo):
        pass
    assert session.last.state == "error" and re.search(said, session.last.message), session.last.message


def test_every_setting_of_the_page_is_a_generate_flag_with_the_same_default():
    """The page's controls (run/settings.Settings) and generate's flags ask for a run with the same words
    and start from the same values (both read GenerationConfig's and Sampling's defaults)."""
    from dataclasses import fields

    from specviz.cli.main import build_parser
    from specviz.run.spec import parse
    from specviz.run.settings import Settings

    flags = build_parser().parse_args(["generate", "--prompt", "x"])
    page = Settings(prompt="x")
    for f in fields(Settings):
        assert hasattr(flags, f.name), f"the page's {f.name} has no generate flag --{f.name.replace('_', '-')}"
        mine, theirs = getattr(page, f.name), getattr(flags, f.name)
        if f.name == "drafter":  # the same drafter, as each spells it ("prompt lookup", "pld")
            mine, theirs = parse(mine).label, parse(theirs).label
        if f.name == "chat":  # generate's None: the template when the model has one, as every model the page offers
            theirs = True if theirs is None else theirs
        assert mine == theirs, f"{f.name}: the page starts from {mine!r}, generate from {theirs!r}"


def test_the_drafter_flags_help_says_every_kind_of_the_one_table():
    """generate's --drafter and the bench's --drafters say each kind from run/spec.py's table (the bench's with
    its own kinds): a kind added there is named in both with nothing else to edit."""
    from specviz.bench.drafters import KINDS as BENCH
    from specviz.cli.main import build_parser
    from specviz.run.spec import FORMS, KINDS, MODEL

    commands = build_parser()._subparsers._group_actions[0].choices
    for command, flag, kinds in (("generate", "drafter", KINDS), ("bench", "drafters", BENCH)):
        said = next(a.help for a in commands[command]._actions if a.dest == flag)
        for kind in kinds.values():
            if kind is not MODEL:
                assert f"{kind.typed} ({kind.says or kind.label}" in said, (command, kind.name)
        assert all(f"{form} (" in said for form, _ in FORMS) and "Hub id or folder" in said


@pytest.mark.parametrize("flag, value, sentence", [("k", 65, "k must be from 1 to 64, got 65"),
                                                   ("top_k", 201, "top-k must be from 0 to 200, got 201"),
                                                   ("temperature", 2.5, "temperature must be from 0 to 2, got 2.5")])
def test_a_value_outside_a_settings_bounds_is_refused_in_one_sentence_by_generate_and_the_app(flag, value, sentence,
                                                                                              capsys):
    """run/settings.py's bounds, which the page's sliders are drawn with (test_app_logic), checked alike by
    generate's flags and the app's API, before any model loads."""
    assert main(["generate", "--prompt", PROMPT, f"--{flag.replace('_', '-')}", str(value)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {sentence}"
    handlers, session = Handlers(Policy(), models), Session()
    *_, said = handlers.generate(handlers.arm(session), prompt=PROMPT, mode="sampling", **{flag: value})
    assert (said["summary"]["state"], said["summary"]["message"]) == ("error", sentence)
