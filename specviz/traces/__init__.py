"""A run kept: each token's display text (labels.py), the trace file (run/replay.py plays it back).
May import: core, modeling, engine, render (its Trace and Labels).
"""
