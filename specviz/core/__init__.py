"""The exact-decoding maths and the events every layer speaks (verify, sampling, tree, theory, ...).
May import: nothing else of specviz (torch and the standard library), so it reads and tests alone.
"""
