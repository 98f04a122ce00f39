"""Reading the panels: a "hide rejected drafts" switch, and the tokens' hover cards opened
by keyboard and touch as well as by the mouse.

Both happen in the browser only (no request, no re-run): the switch puts a CSS class on the
speculative panel, and assets/specviz.js lets a tap (or Enter) pin a token's card open;
keyboard focus shows it through the stylesheet (assets/style.css, .tok:focus-visible). A run's
text is one listbox (render/html.py token_list): one Tab stop, and the arrow keys, Home and End
move between its tokens, carrying the Tab stop with them (the "roving tabindex" pattern).
"""
from __future__ import annotations

import gradio as gr


def controls() -> gr.Checkbox:
    hide = gr.Checkbox(False, label="hide rejected drafts", elem_id="sv-hide-rejected", container=False,
                       info="show only the text the run kept")
    hide.change(None, hide, hide, js="svHide", queue=False, api_visibility="private")
    return hide
