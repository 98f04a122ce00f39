"""The specviz playground: `python app.py`, then open http://127.0.0.1:7860.

Thin on purpose: the page is built in specviz/ui, the pictures in specviz/render.
--host/--port default to Gradio's GRADIO_SERVER_NAME/GRADIO_SERVER_PORT, else 127.0.0.1:7860.
Hosted mode (allow-listed models, capped tokens) is on when SPACE_ID or SPECVIZ_HOSTED=1 is set.
"""
from __future__ import annotations

import argparse

from specviz.ui import build_app, launch_options

demo = build_app()  # module level: Hugging Face Spaces looks for `demo`


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Watch speculative decoding draft, accept and reject tokens.")
    parser.add_argument("--host", help="interface to listen on (default: $GRADIO_SERVER_NAME or 127.0.0.1; "
                                       "0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, help="port (default: $GRADIO_SERVER_PORT or 7860)")
    parser.add_argument("--share", action="store_true", help="also serve through a temporary public gradio.live link")
    args = parser.parse_args(argv)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch_options())


if __name__ == "__main__":
    main()
