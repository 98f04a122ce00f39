"""The model matrix, `python -m specviz matrix`: every decoder family (families.py) x precision x drafter
on tiny random models, greedy, against plain decoding (cells.py): a check of exactness, not a benchmark.
May import: core, modeling, drafters, engine, run (drafter specs), train (the EAGLE and Medusa heads it trains per family).
"""
