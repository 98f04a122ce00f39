"""The one exception type users see.

Anything raised as a SpecvizError carries a message written for the person at the
keyboard; the CLI prints it without a traceback and the app shows it in the page.
"""


class SpecvizError(Exception):
    """An error caused by input or environment, with a readable message."""
