"""The page's blocks, one file each: `controls()` builds a block, `wire(c, page)` connects it."""
