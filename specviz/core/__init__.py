"""The exact-decoding maths and the events every layer speaks: verify, sampling, tree, theory, distribution, exactness, re-timing.
May import: nothing else in specviz (torch and the standard library only), so it can be read and tested alone.
"""
