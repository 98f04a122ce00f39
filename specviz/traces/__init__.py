"""A run kept and played back: each token's display text (labels.py), the trace file, replaying it.
May import: core, modeling, engine, render (its Trace and Labels).
"""
