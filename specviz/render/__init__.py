"""Rendering: pure functions from traces of engine events to HTML and plotly figures.

No gradio, no torch, no tokenizer here: the UI feeds in Traces (events plus each token's
display text) and shows what comes out.
"""
from .charts import compare_figures, empty_figures, playground_figures
from .compare import compare_rows, side_by_side_html, table_values
from .html import KIND_HELP, legend_html, panel_html, tokens_html
from .inspect import step_html
from .numbers import Headline, agreement, agreement_html, headline, headline_html, predicted_speedup
from .status import status_html
from .trace import Labels, Trace

__all__ = [
    "KIND_HELP", "Headline", "Labels", "Trace", "agreement", "agreement_html", "compare_figures",
    "compare_rows", "empty_figures", "headline", "headline_html", "legend_html", "panel_html",
    "playground_figures", "predicted_speedup", "side_by_side_html", "status_html", "step_html",
    "table_values", "tokens_html",
]
