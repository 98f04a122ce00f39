"""Task prompts built from text every machine has: Python's standard library, /usr/share/doc.

`code_tasks` picks functions and classes out of stdlib modules with `ast` and asks for an
edit with the code in the prompt; `doc_tasks` cuts documentation into passages and asks for
a summary or a rewrite. Both are pure functions of (seed, the files on this machine).
"""
from __future__ import annotations

import ast
import functools
import gzip
import pathlib
import random
import re
import sysconfig
import textwrap

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
DOC_ROOTS = (pathlib.Path("/usr/share/doc"),)
DOC_NAMES = re.compile(r"(readme|news|faq|howto|usage|intro|guide|manual|\.txt|\.md|\.rst)", re.I)
BOILERPLATE = re.compile(r"warranty|hereby granted|general public license|copyright|all rights reserved|"
                         r"spdx|redistribution", re.I)

CODE_TEMPLATES = {  # name -> (phrasings); {name} {module} {old} {new} {code} are filled in
    "hints": ("Annotate this function from Python's `{module}` module with type hints for every "
              "argument and the return value, and show the annotated version.",
              "Please add PEP 484 annotations to the code below (taken from `{module}`)."),
    "doc": ("The docstring of this `{module}` code was removed. Write a fitting one and show the code with it.",
            "Document this code from `{module}`: add a docstring that says what it does, its "
            "arguments and what it returns."),
    "rename": ("In the code below, rename `{old}` to `{new}` everywhere it appears and give back the result.",
               "Change the name `{old}` to `{new}` in this snippet from `{module}`; nothing else should change."),
    "rewrite": ("Rewrite this code from `{module}` so it is easier to read, with the same behaviour.",
                "Refactor the following into smaller helper functions and explain the split in one sentence.",
                "Rewrite this Python code in JavaScript, keeping the structure."),
    "explain": ("Explain what this code from the `{module}` module does, step by step.",
                "What does the following function do? Describe its inputs, output and edge cases briefly."),
    "tests": ("Write a few pytest tests for this code from `{module}`.",),
}

DOC_TEMPLATES = (
    ("summarisation", "Summarise this documentation excerpt in two or three sentences."),
    ("summarisation", "List the main points of the following text as short bullet points."),
    ("summarisation", "Give this section a short title, then a one-line summary of it."),
    ("rewriting", "Rewrite this passage in plain words for someone who has never used the tool."),
    ("rewriting", "Make the following text more concise without dropping any facts."),
    ("rewriting", "Turn this documentation into a short FAQ: three questions, each with its answer."),
    ("translation", "Translate the following documentation into {language}."),
)
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese")


def stdlib_files() -> list[pathlib.Path]:
    """The standard library's modules, tests and installed packages left out."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts))


def _parse(path: pathlib.Path):
    try:
        source = path.read_text(encoding="utf-8")
        return source, ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None, None


def _module_name(path: pathlib.Path) -> str:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _code_of(source: str, node) -> str:
    """The node's source, dedented, with its docstring removed (kept for the 'doc' task)."""
    lines = source.splitlines()[node.lineno - 1 - len(node.decorator_list):node.end_lineno]
    body = node.body[0] if node.body else None
    if isinstance(body, ast.Expr) and isinstance(getattr(body, "value", None), ast.Constant) \
            and isinstance(body.value.value, str) and len(node.body) > 1:
        start = node.lineno - len(node.decorator_list)
        del lines[body.lineno - start:body.end_lineno - start + 1]
    return textwrap.dedent("\n".join(lines)).strip("\n")


def _names(node) -> list[str]:
    """Argument and local names an edit may rename (no dunders, no one-letter names)."""
    names = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return sorted(n for n in names if len(n) > 2 and n != "self" and not n.startswith("__"))


def _new_name(old: str, rng: random.Random) -> str:
    if "_" in old.strip("_"):
        head, *rest = old.strip("_").split("_")
        return head + "".join(w.title() for w in rest)  # snake_case -> camelCase
    return f"{old}_{rng.choice(('value', 'item', 'result', 'obj', 'data'))}"


def code_tasks(n: int, seed: int, make, per_file: int = 6) -> list[dict]:
    """Up to `n` code-editing prompts: `make(source, category, prompt)` builds each row."""
    rng = random.Random(f"code-{seed}")
    files = stdlib_files()
    rng.shuffle(files)
    out = []
    for path in files:
        source, tree = _parse(path)
        if tree is None:
            continue
        nodes = [x for x in ast.walk(tree) if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and 4 <= x.end_lineno - x.lineno + 1 <= 40]
        for node in rng.sample(nodes, min(per_file, len(nodes))):
            code = _code_of(source, node)
            if len(code) > 1800:
                continue
            kinds = ["rewrite", "explain", "tests", "doc"]
            names = _names(node)
            if names:
                kinds.append("rename")
            if not isinstance(node, ast.ClassDef) and "->" not in code:
                kinds.append("hints")
            kind = rng.choice(kinds)
            old = rng.choice(names) if kind == "rename" else ""
            ask = rng.choice(CODE_TEMPLATES[kind]).format(
                module=_module_name(path), old=old, new=_new_name(old, rng) if old else "")
            out.append(make("code", "code", f"{ask}\n\n```python\n{code}\n```"))
            if len(out) >= n:
                return out
    return out


@functools.lru_cache(maxsize=4)
def doc_files(roots=DOC_ROOTS) -> tuple[pathlib.Path, ...]:
    """Stdlib modules (for their docstrings), then text files under `roots` where they exist."""
    files = stdlib_files()
    for root in roots:
        if root.is_dir():
            files += sorted(p for p in root.rglob("*") if DOC_NAMES.search(p.name) and p.is_file()
                            and p.stat().st_size < 200_000)
    return tuple(files)


def passages_of(path: pathlib.Path) -> list[str]:
    """A file's passages: a module's long docstrings, or a text file (gzipped or not) cut up."""
    if path.suffix == ".py":
        _, tree = _parse(path)
        nodes = [x for x in ast.walk(tree) if isinstance(x, (ast.Module, ast.ClassDef, ast.FunctionDef))] \
            if tree else []
        texts = [d for d in map(ast.get_docstring, nodes) if d and len(d) >= 300]
    else:
        texts = [_read_doc(path)]
    return [p for t in texts for p in _passages(t)]


def doc_passages(n: int, seed: int, roots=DOC_ROOTS, per_file: int = 4) -> list[str]:
    """Up to `n` passages of 300-1500 characters, at most `per_file` from each file, files in
    a seeded order; licence boilerplate left out."""
    rng = random.Random(f"docs-{seed}")
    files = list(doc_files(tuple(roots)))
    rng.shuffle(files)
    out = []
    for path in files:
        found = passages_of(path)
        out += rng.sample(found, min(per_file, len(found)))
        if len(out) >= n:
            break
    return out[:n]


def _read_doc(path: pathlib.Path) -> str:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return ""


def _passages(text: str, lo: int = 300, hi: int = 1500) -> list[str]:
    """Consecutive paragraphs grouped into passages of lo..hi characters."""
    out, cur = [], ""
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para:
            continue
        if cur and len(cur) + len(para) > hi:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para
    out.append(cur)
    return [p for p in out if lo <= len(p) <= hi and _prose(p)]


def _prose(text: str) -> bool:
    letters = sum(c.isalpha() for c in text)
    return letters >= 0.6 * len(text) and not BOILERPLATE.search(text)


def doc_tasks(n: int, seed: int, make, roots=DOC_ROOTS) -> list[dict]:
    """Up to `n` summarising / rewriting / translating prompts over `doc_passages`."""
    rng = random.Random(f"doc-tasks-{seed}")
    out = []
    for passage in doc_passages(n, seed, roots):
        category, ask = rng.choice(DOC_TEMPLATES)
        out.append(make("docs", category, f"{ask.format(language=rng.choice(LANGUAGES))}\n\n{passage}"))
    return out
