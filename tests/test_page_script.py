"""The page's JavaScript lives in assets/specviz.js, reaches every page through Gradio's head, and
each event's js= names a function that file defines (issue 65.4: no JavaScript in Python strings)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from specviz.ui.layout import launch_options

UI = Path(__file__).resolve().parents[1] / "specviz" / "ui"
SCRIPT = UI.parents[1] / "assets" / "specviz.js"
CODE = re.compile(r"=>|\bdocument\.|\bfunction\s*\(|\bwindow\.|addEventListener|querySelector")


def _strings(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_no_python_file_under_ui_holds_javascript():
    found = [f"{p.relative_to(UI)}:{line}" for p in sorted(UI.rglob("*.py")) for line, s in _strings(p)
             if CODE.search(s)]
    assert not found, f"JavaScript in Python strings (move it to assets/specviz.js): {found}"


def test_the_script_reaches_the_page_head_and_defines_every_function_an_event_names():
    script = SCRIPT.read_text(encoding="utf-8")
    head = launch_options()["head"]
    assert script.strip() and script in head and head.startswith("<script>")
    named = {m for p in UI.rglob("*.py") for m in re.findall(r'js="(\w+)"', p.read_text(encoding="utf-8"))}
    assert named, "no event names a function: the scan above lost its way"
    missing = [n for n in sorted(named) if not re.search(rf"\b{n}\s*=|function\s+{n}\b", script)]
    assert not missing, f"js= names functions assets/specviz.js does not define: {missing}"
