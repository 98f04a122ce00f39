"""Rendering: pure functions from traces of engine events to HTML and plotly figures.

No gradio, no torch, no tokenizer here: the UI feeds in Traces (events plus each token's
display text) and shows what comes out. Names are imported lazily (as in specviz/__init__),
so the command line, which needs only `render.kinds` and `render.trace`, never loads plotly:
training runs on a machine that has none.
May import: core only (events, distribution, metrics): no engine, no models.
"""
from importlib import import_module

_HOMES = {
    "compare_figures": "charts", "empty_figures": "charts", "playground_figures": "charts",
    "PLAYGROUND_CHARTS": "charts", "playground_chart_data": "charts",
    "compare_rows": "compare", "side_by_side_html": "compare", "table_values": "compare",
    "KIND_HELP": "html", "legend_html": "html", "panel_html": "html", "tokens_html": "html",
    "step_html": "inspect",
    "Headline": "numbers", "agreement": "numbers", "agreement_html": "numbers", "divergence": "numbers",
    "headline": "numbers",
    "headline_html": "numbers",
    "primer_html": "primer",
    "status_html": "status",
    "Labels": "trace", "Trace": "trace",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module 'specviz.render' has no attribute {name!r}")
