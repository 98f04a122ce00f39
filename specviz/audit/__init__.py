"""The exactness audit: `python -m specviz audit` asks whether an engine's speculative sampling keeps
its target's distribution, by drawing short completions with and without speculation.

stats.py     the two-sample tests, total variation with its interval, and the test's power
May import: core, modeling, drafters, engine, serving (servers) and bench (transformers' generate).
"""
