"""Uploads the app refuses in its own sentence, said in the browser before a file is sent.

Gradio checks its upload limit (launch's max_file_size) in the browser and answers a file over
it with a red "Error" in the file box while the page's status still says "Ready"; a file under
Gradio's limit but over the app's was sent whole, then refused. So the page checks the app's own
limit first: a file over it is never sent, and the sentence the server would say appears in the
status lines named. The server keeps its check (a script does not run this).
"""
from __future__ import annotations

import gradio as gr

from ...render.status import megabytes, status_html
from ..page import said


def guard(box: str, limit: int, sentence, shown_in: tuple[str, ...]) -> gr.HTML:
    """Refuse files over `limit` bytes dropped or chosen in the file box `box` (a CSS selector),
    in the browser: sentence(name, size, limit) says why, as the server would (sizes as
    megabytes() says them), in the status blocks `shown_in`."""
    rule = dict(box=box, limit=limit, shown_in=list(shown_in), status=status_html("", "error"),
                sentence=sentence("{name}", "{size}", megabytes(limit)))
    return said("upload-rule", rule)  # assets/specviz.js refuses by it
