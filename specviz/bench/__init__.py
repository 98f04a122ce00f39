"""The benchmark: `python -m specviz bench` (see command.py for the options).

Layers: run/suites.py (prompts) -> runner (interleaved runs, measured costs) -> summary
(medians, speedups, predictions) -> report / html (terminal, JSON, CSV, HTML).
May import: core, modeling, drafters, engine, render (rules), run (its prompt suites), serving (bench --server).
"""
from .command import add_arguments, main

__all__ = ["add_arguments", "main"]
