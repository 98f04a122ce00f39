"""Models and their text: loading, the forward every call goes through (and its fast path), threads.
May import: core only. Nothing here knows of drafting, the engine or any view.
"""
