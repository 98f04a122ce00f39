"""Models and their text: loading (models.py), the forward every call goes through and its fast Llama path, tokenizer text, threads.
May import: core only. Nothing here knows of drafting, the engine or any view.
"""
