"""Starting the server: torch's thread count first, then Gradio, then our own start-up line.

Gradio's own line tells a user who did not share to "set `share=True` in `launch()`", which
is advice for someone editing the code; users of `python app.py` want `--share`.
"""
from __future__ import annotations

from ..modeling import threads
from .layout import launch_options


def serving_message(local_url: str, share_url: str | None, share: bool) -> str:
    """What `python app.py` prints once the page is served."""
    if share_url:
        return f"specviz: serving on {local_url} and, for up to a week, on {share_url}"
    if share:
        return f"specviz: serving on {local_url} only; the public link could not be made (see above)"
    return f"specviz: serving on {local_url} (python app.py --share adds a temporary public link)"


def serve(demo, host: str | None, port: int | None, share: bool) -> None:
    """Launch `demo` and block until Ctrl-C."""
    # Before any request: Gradio steps a run's generator on whichever pool thread is free, and
    # torch fixes each thread's count the first time it computes, so the app chooses once.
    print(f"specviz: {threads.for_run('app')}", flush=True)
    demo.launch(server_name=host, server_port=port, share=share, quiet=True, prevent_thread_lock=True,
                **launch_options())
    print(serving_message(demo.local_url, demo.share_url, share), flush=True)
    demo.block_thread()
