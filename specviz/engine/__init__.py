"""The decoding loop (generate.py), one verify step, dynamic k, verify costs, runs taking turns.
May import: core, modeling, drafters (the engine talks to any Drafter through drafters/base.py).
"""
