"""How a run is asked for, once for every entry point: the drafter named, the settings checked, the race of
speculative and plain decoding and its replay, the prompt suites. The CLI, the app and the bench keep only their
presentation.
May import: core, modeling, drafters, engine, render, traces.
"""
