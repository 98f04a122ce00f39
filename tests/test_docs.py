"""The README and docs/ stay true: every measured table is what its committed results file
draws (`python -m specviz docs`), and every command they show exists with the flags shown;
the local ones run, on a tiny offline model."""
from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import io
import json
import re
import shlex

import pytest
import torch

from specviz.bench import report
from specviz.bench.drafters import make_drafters
from specviz.bench.runner import BenchConfig, run_benchmark
from specviz.bench.summary import summarise
from specviz.cli import main as cli, docs_tables
from specviz.core.errors import SpecvizError
from specviz.modeling.threads import environment
from specviz.run import suites
from test_bench import loaded
from tiny_folder import make_tiny_model_dir

ROOT = docs_tables.ROOT
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


# ------------------------------------------------------------------ measured tables

@pytest.mark.parametrize("page", docs_tables.pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_is_what_its_results_file_draws(page):
    text = page.read_text(encoding="utf-8")
    assert text == docs_tables.rewrite(text), (
        f"{page.relative_to(ROOT)}: a measured table differs from its results file; run `{docs_tables.COMMAND}`")


def test_every_page_has_its_tables_between_markers():
    # a table of numbers must come from a file: count the marked ones so a page cannot lose them silently
    marked = {str(p.relative_to(ROOT)): len(docs_tables.MARKER.findall(p.read_text())) for p in docs_tables.pages()}
    assert marked["README.md"] >= 1 and marked["docs/performance.md"] >= 3 and marked["docs/serving.md"] >= 1


@pytest.fixture(scope="module")
def bench_doc(target):
    prompt = suites.BenchPrompt("copy", "code", (("user", "x"),))
    cfg = BenchConfig(max_new_tokens=6, ks=(2,), dynamic_k=1, repeats=1, cost_repeats=1)
    result = run_benchmark(target, make_drafters(["pld"], loaded(target)), [(prompt, list(range(10)) * 3)], cfg)
    config = {"command": "python -m specviz bench --k 2 --dynamic-k 1", "greedy": True}
    return report.document(result, summarise(result), config, environment("cpu", torch.float32))


def page_with(tmp_path, doc, kinds):
    (tmp_path / "r.json").write_text(json.dumps(doc))
    (tmp_path / "docs").mkdir()
    stale = "".join(f"<!-- table: r.json {k} -->\nold\n<!-- /table -->\n" for k in kinds)
    (tmp_path / "README.md").write_text("# page\n" + stale)
    return tmp_path / "README.md"


def test_docs_command_redraws_a_stale_table_and_check_fails_until_then(tmp_path, bench_doc, capsys):
    kinds = [k for k in docs_tables.KINDS if k.startswith("bench")]
    page = page_with(tmp_path, bench_doc, kinds)
    check = argparse.Namespace(check=True)
    assert docs_tables.main(check, tmp_path) == 1
    assert "README.md" in capsys.readouterr().err and "old" in page.read_text()
    assert docs_tables.main(argparse.Namespace(check=False), tmp_path) == 0
    text = page.read_text()
    assert "old" not in text and docs_tables.main(check, tmp_path) == 0
    assert "`pld k=2`" in text and "`pld dynamic k=1`" in text  # every arm, by the bench's own name
    assert "python -m specviz bench --k 2 --dynamic-k 1" in text and "torch " + torch.__version__ in text
    # a re-measured file makes the committed table stale again
    bench_doc = {**bench_doc, "created": "2031-01-01T00:00:00+00:00"}
    (tmp_path / "r.json").write_text(json.dumps(bench_doc))
    assert docs_tables.main(check, tmp_path) == 1


def test_headline_names_each_drafters_fastest_arm(bench_doc):
    table = docs_tables.bench_headline(bench_doc)
    rows = [r for r in table.splitlines() if r.startswith("| pld")]
    best = max((r for r in bench_doc["summary"] if r["category"] == "all" and r["drafter"] == "pld"),
               key=lambda r: r["speedup"])
    assert len(rows) == 1 and f"`{best['arm']}`" in rows[0] and f"{best['speedup']:.2f}x" in rows[0]


def test_results_named_before_they_are_measured_are_written_by_a_command_shown():
    # a table may wait for its file, but only for a file some command in the docs writes
    written = {w[i + 1] for _, w in commands() for i, a in enumerate(w[:-1]) if a in ("--json", "--out")}
    for page in docs_tables.pages():
        for m in docs_tables.MARKER.finditer(page.read_text()):
            path = m.group("path")
            assert (ROOT / path).exists() or path in written, f"{page.name}: nothing shown writes {path}"


def test_a_missing_or_wrong_results_file_is_one_sentence(tmp_path):
    assert "Not measured for this version yet" in docs_tables.render("nope.json", "load", tmp_path)
    (tmp_path / "r.json").write_text("{}")
    with pytest.raises(SpecvizError, match="cannot be drawn as load"):
        docs_tables.render("r.json", "load", tmp_path)
    with pytest.raises(SpecvizError, match="unknown table kind"):
        docs_tables.render("r.json", "pie", tmp_path)


# ------------------------------------------------------------------ links

LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_pages_lands_on_a_file_and_heading():
    for page in docs_tables.pages():
        for target in LINK.findall(page.read_text()):
            if re.match(r"https?:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (ROOT / path.lstrip("/")) if path.startswith("/") else (page.parent / path if path else page)
            assert file.exists(), f"{page.relative_to(ROOT)} links to {target}: no such file"
            if anchor:
                headings = {slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
                assert anchor in headings, f"{page.relative_to(ROOT)} links to {target}: no such heading"


# ------------------------------------------------------------------ commands shown

def shown(lang: str) -> list[tuple[str, str]]:
    """(page name, block text) for every fenced block of this language in README and docs/."""
    return [(p.name, m.group(2)) for p in docs_tables.pages()
            for m in FENCE.finditer(p.read_text(encoding="utf-8")) if m.group(1) == lang]


def commands() -> list[tuple[str, list[str]]]:
    """Every simple command in the bash blocks, as words: `a && b & c` is three."""
    out = []
    for page, block in shown("bash") + shown("sh"):
        for line in block.replace("\\\n", " ").splitlines():  # a line per command line; `#` ends one
            lex = shlex.shlex(line, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            words: list[str] = []
            for w in [*lex, ";"]:
                if w in ("&&", "&", ";", "||", "|") or w.startswith(("&", ";")):
                    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value before a command
                        words.pop(0)
                    if words:
                        out.append((page, words))
                    words = []
                else:
                    words.append(w)
    return out


def check_flags_in(path: str, args: list[str]) -> None:
    text = (ROOT / path).read_text()
    for flag in (a.split("=")[0] for a in args if a.startswith("--")):
        assert re.search(rf"{re.escape(flag)}\b", text), f"{path} has no option {flag}"


@functools.cache
def app_parser():
    """app.py's parse_args without importing app.py, which builds the whole Gradio page."""
    from specviz.serving.urls import check_url

    tree = ast.parse((ROOT / "app.py").read_text())
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("parse_args", "_url")]
    space = {"argparse": argparse, "check_url": check_url, "SpecvizError": SpecvizError}
    exec(compile(ast.Module(defs, []), "app.py", "exec"), space)
    return space["parse_args"]


def check(words: list[str]) -> None:
    """Fails unless the command exists and takes the flags shown (parsing only, nothing runs)."""
    prog, *args = words
    if prog in ("python", "python3") and args[:2] == ["-m", "specviz"]:
        cli.build_parser().parse_args(args[2:])
    elif prog in ("python", "python3") and args[:1] == ["app.py"]:
        app_parser()(args[1:])
    elif prog in ("python", "python3") and args[:1] == ["-m"]:
        assert args[1] in ("venv", "pytest", "specviz.train.measure"), words
    elif prog in ("pip", "python") or prog == "pip3":
        assert args[0] in ("install", "download"), words
        for i, a in enumerate(args):
            if a == "-r":
                assert (ROOT / args[i + 1]).is_file(), f"no {args[i + 1]}"
    elif prog == "bash":
        assert (ROOT / args[0]).is_file(), f"no {args[0]}"
        if args[0] == ".ci/run" and args[1:2] not in ([], ["-m"]):
            check_flags_in(".ci/run", [a for a in args[1:] if a.startswith("--") and a != "--vllm"])
    elif prog.startswith("scripts/"):
        assert (ROOT / prog).is_file(), f"no {prog}"
        check_flags_in(prog, args[: args.index("--")] if "--" in args else args)
    elif prog in (".", "source"):
        assert args == [".venv/bin/activate"], words
    else:
        raise AssertionError(f"the docs show `{shlex.join(words)}`, which this test cannot check: teach it how")


def test_every_command_shown_exists_with_the_flags_shown(capsys):
    seen = commands()
    assert len(seen) > 20  # the parser found the blocks
    for page, words in seen:
        try:
            check(words)
        except SystemExit:
            pytest.fail(f"{page}: `{shlex.join(words)}`: {capsys.readouterr().err.strip().splitlines()[-1]}")


def test_a_doc_showing_a_flag_that_does_not_exist_fails():
    for words in (["python", "-m", "specviz", "generate", "--prompt", "x", "--drafts", "pld"],
                  ["python", "app.py", "--hots", "0.0.0.0"], ["scripts/serve-vllm.sh", "--spec-len", "4"]):
        with pytest.raises((SystemExit, AssertionError)), contextlib.redirect_stderr(io.StringIO()):
            check(words)


def test_the_set_up_commands_are_the_two_the_readme_promises():
    readme = [words for page, words in commands() if page == "README.md"]
    assert readme[-1] == ["bash", ".ci/run"]
    assert readme[-2] == ["python", "app.py"] and ["pip", "install", "-r", "requirements.txt"] in readme


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "m"))


def runnable(words: list[str]) -> bool:
    """Local generate/replay runs whose drafter needs no trained weights for the embedded model,
    and `docs` (as --check: a test never rewrites the pages)."""
    if words[:3] != ["python", "-m", "specviz"] or words[3] not in ("generate", "replay", "docs"):
        return False
    args = cli.build_parser().parse_args(words[3:])
    return args.command in ("replay", "docs") or (not args.server and args.drafter in ("pld", "none") and args.target == "default")


def test_local_commands_shown_run_on_a_tiny_model(tiny, tmp_path, capsys):
    trace = str(tmp_path / "run.json")
    ran = 0
    for page, words in filter(lambda pw: runnable(pw[1]), commands()):
        argv = words[3:]
        if argv[0] == "generate":
            argv += ["--target", tiny, "--max-new-tokens", "4", "--trace", trace]
        elif argv[0] == "docs":
            argv = ["docs", "--check"]
        else:
            argv = ["replay", trace, *argv[2:]]  # a tiny run lasts milliseconds, even replayed at its own pace
        assert cli.main(argv) == 0, f"{page}: {shlex.join(words)}\n{capsys.readouterr().err}"
        ran += 1
    assert ran >= 4


def test_library_snippets_run_on_a_tiny_model(tiny, capsys):
    blocks = [b for _, b in shown("python") if "from specviz" in b]
    assert blocks
    for block in blocks:
        exec(compile(block.replace('load("default")', f"load({tiny!r})"), "docs", "exec"), {})
    assert "RunEnd" in capsys.readouterr().out
    for _, block in shown("python"):
        compile(block, "docs", "exec")  # the client snippets need a running app: they must at least parse
