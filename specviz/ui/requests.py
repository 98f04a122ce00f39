"""A script's request with the wrong number of values, refused in a sentence before anything runs.

Gradio checks an API call's values before any handler sees them: one too few got its bare
error ({"error": null}), and one or two too many shifted every value by one (the first went to
the visitor's session, so the prompt was read as the target and the drafter as k) and the
handler blamed the wrong field. Here the count is checked first and said in words.
"""
from __future__ import annotations

import gradio as gr


def _names(block_fn) -> list[str]:
    """The API's parameter names, in the order a script sends them (the session is not one)."""
    named = list(getattr(block_fn, "input_parameter_names", None) or [])
    names = []
    for i, block in enumerate(block_fn.inputs):
        if getattr(block, "skip_api", False):
            continue
        name = named[i] if i < len(named) and named[i] else f"value {len(names) + 1}"
        names.append(name)
    return names


def miscount(block_fn, inputs: list) -> str | None:
    """The sentence for a request whose values do not fill its endpoint's parameters, else None.

    Gradio fills the session slots (gr.State) with None where a script sends only the API's values,
    and gradio_client sends None there itself; a value in a session slot is one the script sent
    too many, which would shift the rest."""
    names, n = _names(block_fn), len(inputs)
    sessions = [i for i, block in enumerate(block_fn.inputs) if getattr(block, "skip_api", False)]
    if n == len(block_fn.inputs) and all(inputs[i] is None for i in sessions):
        return None
    endpoint = f"/{block_fn.api_name}" if getattr(block_fn, "api_name", None) else "this endpoint"
    takes = f"{endpoint} takes {len(names)} values ({', '.join(names)})"
    if n < len(names):
        return f"{takes}; this request sent {n}, without {', '.join(names[n:])}: nothing was run"
    return (f"{takes}; this request sent {n}, {n - len(names)} more than it takes, so its values cannot be "
            "matched to their parameters: nothing was run")


def count_values(demo: gr.Blocks) -> None:
    """Make every endpoint of `demo` refuse a miscounted request with miscount's sentence."""
    check = demo.validate_inputs

    def validate(block_fn, inputs):
        said = miscount(block_fn, inputs)
        if said is not None:
            raise gr.Error(said, print_exception=False)
        check(block_fn, inputs)

    demo.validate_inputs = validate
