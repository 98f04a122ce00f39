"""The decoding loop (generate.py), one verify step, dynamic k and what verifying costs on this machine, runs taking turns.
May import: core, modeling, drafters (the engine talks to any Drafter through drafters/base.py).
"""
