"""Speculative decoding inside a real serving engine (vLLM first; SGLang and llama.cpp through
their own fields), seen from the outside through its OpenAI-compatible HTTP API.

records.py   what one request and one server's counters are (dataclasses, derived rates)
client.py    one streamed completion: text chunk by chunk, timings, the engine's spec fields
engines.py   reading vLLM / SGLang / llama.cpp fields into records
prometheus.py  the server-wide `/metrics` counters, and their change over a run
load.py      the multi-tenant sweep: concurrency levels with speculation on and off

No engine says which drafted token was rejected, so nothing here colours tokens: a step is a
group of tokens the server sent together, with how many drafts it kept.
"""
