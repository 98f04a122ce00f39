"""The specviz playground: `python app.py`, then open http://127.0.0.1:7860.

Thin on purpose: the page is built in specviz/ui, the pictures in specviz/render.
--host/--port default to Gradio's GRADIO_SERVER_NAME/GRADIO_SERVER_PORT, else 127.0.0.1:7860.
Hosted mode (allow-listed models, capped load; specviz/ui/policy.py) is on when SPACE_ID or
SPECVIZ_HOSTED=1 is set, and when the app is reachable beyond this machine (a --host other
than loopback, or --share) unless started with --trust-visitors.
"""
from __future__ import annotations

import argparse

from specviz.ui import build_app, policy_from_env
from specviz.ui.serve import serve

policy = policy_from_env()
demo = build_app(policy)  # module level: Hugging Face Spaces looks for `demo`


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Watch speculative decoding draft, accept and reject tokens.")
    parser.add_argument("--host", help="interface to listen on (default: $GRADIO_SERVER_NAME or 127.0.0.1; "
                                       "0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, help="port (default: $GRADIO_SERVER_PORT or 7860)")
    parser.add_argument("--share", action="store_true", help="also serve through a temporary public gradio.live link")
    parser.add_argument("--trust-visitors", action="store_true",
                        help="with --share or a --host beyond loopback: let every visitor load any model or "
                             "local path, with no caps on load (default there: the hosted policy)")
    return parser.parse_args(argv)


def demo_for(args: argparse.Namespace):
    """`demo`, rebuilt if the arguments change its policy (an exposed app serves strangers)."""
    global demo, policy
    wanted = policy_from_env(host=args.host, share=args.share, trust_visitors=args.trust_visitors or None)
    if wanted != policy:
        demo, policy = build_app(wanted), wanted
        if policy.hosted:
            print("specviz: reachable beyond this machine, so visitors get the hosted policy (allow-listed "
                  "models; capped prompts, tokens, run time and queue); --trust-visitors lifts it")
    return demo


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    serve(demo_for(args), args.host, args.port, args.share)


if __name__ == "__main__":
    main()
