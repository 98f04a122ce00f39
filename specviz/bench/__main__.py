"""`python -m specviz.bench`: the benchmark on its own (the same as `python -m specviz bench`)."""
import argparse
import sys

from ..core.errors import SpecvizError
from . import add_arguments, main

parser = argparse.ArgumentParser(prog="python -m specviz.bench", description=__doc__)
add_arguments(parser)
try:
    sys.exit(main(parser.parse_args()))
except SpecvizError as e:
    print(f"specviz bench: {e}", file=sys.stderr)
    sys.exit(2)
