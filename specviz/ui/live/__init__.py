"""Driving a run for the page, with no Gradio: the run/ layer's steps and races on a worker thread, as Frames
(runner.py: the Playground's; compare.py: Compare's), the handler's thread keeping the page told.
May import: every layer below it, serving (the serving view) among them.
"""
