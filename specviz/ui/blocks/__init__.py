"""The page's blocks, one file each: `controls()` builds a block, `wire(c, page)` connects it.
May import: every layer below it, serving (the serving view) among them.
"""
