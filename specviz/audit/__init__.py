"""The exactness audit: `python -m specviz audit` asks whether an engine's speculative sampling keeps
its target's distribution, by drawing short completions with and without speculation.

stats.py     the two-sample tests, total variation with its interval, the test's power, the fit to the target's p
engines.py   what draws: specviz's loop, transformers' generate, a server (one completion per seed), in pairs
controls.py  verifiers that are deliberately not exact (q before the warpers, Medusa's typical acceptance)
report.py    the verdict (withheld on too few draws or no drafts), the side-by-side table, the file
command.py   `python -m specviz audit`
May import: core, modeling, drafters, engine, render (rules), run (drafter specs), serving (servers), bench (generate).
"""
