"""The specviz playground: `python app.py`, then open http://127.0.0.1:7860.

Thin on purpose: the page is built in specviz/ui, the pictures in specviz/render.
--host/--port default to Gradio's GRADIO_SERVER_NAME/GRADIO_SERVER_PORT, else 127.0.0.1:7860.
Hosted mode (allow-listed models, capped load; specviz/ui/policy.py) is on when SPACE_ID or
SPECVIZ_HOSTED=1 is set, and when the app is reachable beyond this machine (a --host other
than loopback, or --share) unless started with --trust-visitors.
--server URL (and --baseline-server URL) name the serving engines the "Serving engine" tab
talks to, e.g. the one scripts/serve-vllm.sh starts; hosted, they are the only ones it will.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from specviz.core.errors import SpecvizError
from specviz.serving.urls import check_url
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
    parser.add_argument("--server", type=_url, metavar="URL",
                        help="an OpenAI-compatible serving engine with speculation, e.g. http://127.0.0.1:8000 "
                             "from scripts/serve-vllm.sh (default: $SPECVIZ_SERVER_URL)")
    parser.add_argument("--baseline-server", type=_url, metavar="URL",
                        help="the same model served without speculation, to compare tokens/s against "
                             "(default: $SPECVIZ_BASELINE_SERVER_URL)")
    parser.add_argument("--load-result", metavar="PATH",
                        help="a load-sweep JSON (python -m specviz load) to show in the Serving engine tab "
                             "(default: $SPECVIZ_LOAD_RESULT)")
    return parser.parse_args(argv)


def _url(text: str) -> str:
    """An http(s) URL with a host: a typo is told at startup, not by the first visitor's run
    (argparse names the flag: "argument --server: the URL must be ...")."""
    try:
        return check_url(text, "the URL")
    except SpecvizError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def demo_for(args: argparse.Namespace):
    """`demo`, rebuilt if the arguments change its policy (an exposed app serves strangers)."""
    global demo, policy
    wanted = policy_from_env(host=args.host, share=args.share, trust_visitors=args.trust_visitors or None)
    engines = dict(server_url=args.server, baseline_server_url=args.baseline_server, load_result=args.load_result)
    wanted = replace(wanted, **{name: value for name, value in engines.items() if value})
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
