"""Real llama.cpp servers for the tests marked `llamacpp`: started by scripts/serve-llamacpp.sh, or reused.

SPECVIZ_LLAMACPP_URL / SPECVIZ_LLAMACPP_BASELINE_URL point at servers already running (the spec one
with n-gram speculation, the baseline without); otherwise two start here on free loopback ports and
stop when the tests end. The script builds llama-server once into $SPECVIZ_LLAMACPP_DIR (default
~/.cache/specviz/llamacpp, ~9 min on 2 cores) and later starts take seconds. No mock stands in for them.
"""
from __future__ import annotations

import os

from vllm_servers import ROOT, Server, start_pair

SCRIPT = ROOT / "scripts" / "serve-llamacpp.sh"
START_S = 1200  # a first run builds llama-server (~9 min on 2 busy cores); a built one starts in seconds
SLOTS = 4  # -np: at least the load test's concurrency, so no request waits for a slot
# ngram-simple with a 3-token match and 4-token drafts: llama.cpp's defaults (a 12-token match) never
# draft on a short chat, and this was its best setting on the copying prompt here (docs/serving.md).
SPEC_FLAGS = ("--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "4")


def servers():
    """(spec_url, baseline_url, stop): reused from the environment or started here."""
    spec, base = os.environ.get("SPECVIZ_LLAMACPP_URL"), os.environ.get("SPECVIZ_LLAMACPP_BASELINE_URL")
    if spec and base:
        return spec, base, lambda: None
    banner = "llama-server is serving"
    return start_pair(Server("ngram-simple", SCRIPT, banner, ("--", *SPEC_FLAGS, "-np", str(SLOTS))),
                      Server("off", SCRIPT, banner, ("--", "-np", str(SLOTS))), START_S)
