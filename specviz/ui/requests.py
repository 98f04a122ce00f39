"""A script's request with the wrong number of values, refused in a sentence before anything runs.

Gradio checks an API call's values before any handler sees them: one too few got its bare
error ({"error": null}), and one or two too many shifted every value by one (the first went to
the visitor's session, so the prompt was read as the target and the drafter as k) and the
handler blamed the wrong field. Here the count is checked first and said in words. A body Gradio's
routes cannot read at all (no 'data', not JSON) gets a sentence too, in place of FastAPI's bare 422.
"""
from __future__ import annotations

import gradio as gr

from ..run.settings import shown


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


SENDS = "a call sends a JSON object whose 'data' is the list of the endpoint's values"
_WANTS = {"list_type": "a list of the endpoint's values", "int_parsing": "a whole number", "int_type": "a whole number",
          "string_type": "a string", "bool_parsing": "true or false", "bool_type": "true or false",
          "dict_type": "a JSON object", "model_attributes_type": "a JSON object"}


def malformed(errors: list[dict]) -> str:
    """The sentence for a request body that Gradio's routes could not read (FastAPI's validation errors,
    the first said): the field, the value sent (shortened) and what the field takes. FastAPI's bare
    answer was {"detail": [{"type": "missing", "loc": ["body", "data"], ...}]}."""
    e = errors[0] if errors else {}
    kind, loc = e.get("type", ""), [str(p) for p in e.get("loc", ()) if p != "body"]
    if kind == "json_invalid":
        why = (e.get("ctx") or {}).get("error") or "it cannot be parsed"
        return f"this request's body is not valid JSON ({why}): {SENDS}; nothing was run"
    field = ".".join(loc) or "body"
    where = "this request's body" if field == "body" else f"this request's {field!r}"
    if kind == "missing":
        return f"this request's body has no {field!r} field: {SENDS}; nothing was run"
    wants = _WANTS.get(kind) or f"what the API takes ({e.get('msg', kind)})"
    got = e.get("input")
    return f"{where} must be {wants}, got {shown(got)} ({type(got).__name__}): {SENDS}; nothing was run"


async def said_malformed(request, exc):
    """FastAPI's handler for a body its routes cannot read: specviz's sentence, with the field named."""
    from fastapi.responses import JSONResponse

    errors = list(exc.errors())
    first = errors[0] if errors else {}
    field = "body" if first.get("type") == "json_invalid" else (
        ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body")
    return JSONResponse({"error": malformed(errors), "field": field}, status_code=422)


def handlers() -> dict:
    """launch()'s app_kwargs: FastAPI answers a malformed body with specviz's sentence."""
    from fastapi.exceptions import RequestValidationError

    return {"exception_handlers": {RequestValidationError: said_malformed}}
