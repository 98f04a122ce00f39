"""The command line, `python -m specviz ...` (main.py); each application's own command lives with it.
May import: every layer below (it is the top, beside app.py).
"""
