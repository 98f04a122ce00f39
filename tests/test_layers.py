"""The package's shape: folders are layers, imports only go down (never to a sibling of the same rank),
no two modules or packages import each other, and each package's "May import" line is true.

Read from the source with `ast` (nothing is imported, so this runs without torch): every
`import` in every module counts, the ones inside functions too, since a lazy import still
ties the two modules together. An exception needs a line in ALLOWED saying why.
"""
from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specviz"

# Bottom to top. A module may import from its own layer and the ones below, never above.
LAYERS = (
    ("core",),  # the pure maths and the events: verify, sampling, tree, theory, distribution
    ("modeling",),  # loading models, the fast forward, tokenizer text, threads
    ("drafters",),  # one file per way of proposing drafts
    ("engine",),  # the decoding loop, one verify step, dynamic k, runs taking turns
    ("render",),  # events and traces to HTML and figures
    ("traces",),  # trace files, replaying them, each token's display text
    ("run",),  # one way to ask for a run: drafter specs, settings, the race, prompt suites
    ("serving", "train"),  # the applications that need no other: serving engines from outside, training drafters
    ("bench", "matrix"),  # the measurements: the benchmark (bench --server reads serving), the family matrix (trains heads)
    ("audit",),  # the exactness audit of any engine (servers through serving, transformers through bench)
    ("ui",),  # the Gradio app (its serving tab reads serving)
    ("cli",),  # the command line
    ("",),  # the package face: specviz/__init__.py and __main__.py
)
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}

# (importer, imported): why the upward import is fine. Keep this empty where possible.
ALLOWED: dict[tuple[str, str], str] = {}


def modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """Dotted name -> (file, is a package's __init__)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return found


def imports(name: str, path: pathlib.Path, is_pkg: bool, known) -> set[str]:
    """The specviz modules `name` imports, anywhere in its body."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "specviz"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[:len(name.split(".")) - (node.level - (1 if is_pkg else 0))]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "specviz":
                continue
            for a in node.names:  # `from .pkg import module` imports the module, not just the package
                out.add(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target)
    return out - {name}


def layer(name: str) -> str:
    parts = name.split(".")
    return "" if len(parts) == 1 or parts[1] == "__main__" else parts[1]


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, is_pkg, known) for name, (path, is_pkg) in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_sits_in_a_known_layer():
    # The top of specviz/ holds packages and the package face only.
    loose = sorted(n for n in modules() if layer(n) not in RANK)
    assert loose == [], f"outside any layer (move them into a layer's folder, or add it to LAYERS): {loose}"


def packages() -> dict[str, set[str]]:
    """Layer -> the other layers its modules import."""
    out: dict[str, set[str]] = {}
    for src, targets in graph().items():
        out.setdefault(layer(src), set()).update(layer(dst) for dst in targets if layer(dst) != layer(src))
    return out


def test_imports_only_go_down():
    # Up a rank, or across to a sibling of the same rank (the applications are ranked so that none needs one).
    upward = sorted(
        f"{src} imports {dst}" for src, targets in graph().items() for dst in targets
        if layer(dst) != layer(src) and RANK.get(layer(dst), -1) >= RANK.get(layer(src), -1)
        and (src, dst) not in ALLOWED)
    assert upward == [], "imports from a higher layer or a sibling:\n" + "\n".join(upward)


def test_no_import_loops():
    assert cycles(graph()) == [], "modules that import each other (directly or round a loop)"
    assert cycles(packages()) == [], "packages that import each other (directly or round a loop)"


def may_import(doc: str, name: str) -> set[str]:
    """The layers a package's "May import:" line names, read up to its first ';', ':' or full stop
    (what follows says why, or what never): "every layer below" names every lower rank."""
    line = doc.split("May import:", 1)[1].split("\n", 1)[0]
    said = re.split(r"[;:]|\.(?:\s|$)", line, maxsplit=1)[0]
    if "every layer below" in said:
        return {other for other in RANK if RANK[other] < RANK[name]}
    if "every layer" in said:
        return set(RANK) - {name}
    return set(re.findall(r"[a-z]+", said)) & set(RANK) - {name}  # its own name may appear ("bench --server")


def test_every_import_names_a_real_module():
    # A moved module leaves no import pointing at its old place.
    known = set(modules())
    missing = sorted(f"{src} imports {dst}" for src, targets in graph().items() for dst in targets if dst not in known)
    assert missing == []


def test_each_package_says_truly_what_it_may_import():
    imported = packages()
    for name, (path, is_pkg) in modules().items():
        if not is_pkg:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "May import:" in doc, f"{path}: the docstring says what the package may import"
        allowed = may_import(doc, layer(name))
        above = sorted(p for p in allowed if RANK[p] >= RANK[layer(name)])
        assert above == [], f"{path}: its May import line names {above}, not below it in LAYERS"
        unsaid = sorted(imported.get(layer(name), set()) - allowed)
        assert unsaid == [], f"{path}: it imports {unsaid}, which its May import line does not name"


def test_the_check_finds_a_loop_and_an_upward_import():
    # The checks can fail: a made-up graph with both faults.
    assert cycles({"specviz.core.a": {"specviz.core.b"}, "specviz.core.b": {"specviz.core.a"}}) == [
        ["specviz.core.a", "specviz.core.b"]]
    assert RANK[layer("specviz.core.verify")] < RANK[layer("specviz.engine.generate")]
    assert layer("specviz") == layer("specviz.__main__") == ""
    assert RANK["bench"] == RANK["matrix"]  # siblings: test_imports_only_go_down refuses one importing the other


def test_the_may_import_reading():
    assert may_import("x.\nMay import: core and modeling; never the engine, which imports them.", "drafters") == {
        "core", "modeling"}
    assert may_import("May import: core only (events, distribution, metrics): no engine, no models.", "render") == {
        "core"}
    assert may_import("May import: every layer below it, serving (the serving view) among them.", "ui") == {
        name for name in RANK if RANK[name] < RANK["ui"]}
    assert may_import("May import: nothing else of specviz (torch and the standard library).", "core") == set()

