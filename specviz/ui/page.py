"""The page's shared parts by name: what layout.py builds and every view's wire() takes.

Handlers give their values by name ({"status": ..., "spec": ...}); `named` turns them into
the {component: value} Gradio takes, and fails loudly when a handler and the components it
is wired to disagree, so adding an output is one name in layout.py and one in views.py.
"""
from __future__ import annotations

import contextlib
import functools
import html
import inspect
import json
from dataclasses import dataclass, field
from typing import Callable

import gradio as gr

from .handlers import Handlers
from .policy import Policy


def named(fn: Callable, outputs: dict[str, gr.components.Component]) -> Callable:
    """`fn` (a function or a generator) returning values by name, wrapped to return them by
    component from `outputs`. A handler gives every output it is wired to (gr.skip() leaves
    one as it is): a name missing or unknown is a slip, raised rather than shown blank."""
    def by_component(values: dict) -> dict:
        if values.keys() != outputs.keys():
            missing, unknown = outputs.keys() - values.keys(), values.keys() - outputs.keys()
            raise ValueError(f"{fn.__name__} gave values for {sorted(unknown)} but none for {sorted(missing)}: "
                             "its names and its outputs' (ui/layout.py) must agree")
        return {outputs[name]: value for name, value in values.items()}

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)  # Gradio reads the signature (request, keyword inputs) through __wrapped__
        def stream(*args, **kwargs):
            for values in fn(*args, **kwargs):
                yield by_component(values)
        return stream

    @functools.wraps(fn)
    def once(*args, **kwargs):
        return by_component(fn(*args, **kwargs))
    return once


def said(name: str, value) -> gr.HTML:
    """`value` on the page, as JSON, for its scripts (assets/specviz.js reads it as svData(name)):
    the words and limits they use are Python's, and no code lives here."""
    return gr.HTML(f'<span data-sv="{name}" data-value="{html.escape(json.dumps(value))}"></span>',
                   container=False, elem_classes="sv-hidden")


@contextlib.contextmanager
def accordion(title: str, elem_id: str, intro: str, open: bool = False):
    """A block's accordion, its intro first; closed unless `open`, as most blocks are questions for after a run."""
    with gr.Accordion(title, open=open, elem_id=elem_id) as box:
        gr.Markdown(intro)
        yield box


@dataclass
class Page:
    """What the views share. `settings`: the prompt and the left column's controls, by Settings
    field; `playground`: the Playground's outputs, by the names views.playground_values gives;
    `on_screen`: the events that put a run on screen (Generate, then the replay's), for the
    blocks that redraw after them."""
    policy: Policy
    models: object
    handlers: Handlers
    session: gr.State
    settings: dict
    drafter: gr.Dropdown
    run: gr.Button
    step: gr.Slider
    playground: dict
    queued: dict  # the options of a run that waits in the handlers' Line
    generate: object = None  # Generate's event (set once wired)
    on_screen: list = field(default_factory=list)

    @property
    def prompt(self) -> gr.Textbox:
        return self.settings["prompt"]

    def shown(self, **more) -> dict:
        """The Playground's outputs and the session, with `more` by name: what a handler that
        redraws the Playground is wired to."""
        return {**self.playground, "session": self.session, **more}
