"""The command line, `python -m specviz {generate,replay,docs,bench,load,train}` (main.py); each application's own command lives with it.
May import: every layer below (it is the top, beside app.py).
"""
