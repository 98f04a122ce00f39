"""Training drafters for a target: `python -m specviz train {draft,medusa,eagle}`.

data.py builds the self-distillation corpus, loop.py trains any Recipe on it with
checkpoints and a held-out acceptance measurement, command.py is the CLI.
May import: core, modeling, drafters, engine (held-out acceptance), run (its prompt suites, a load's progress).
"""
