"""Speculative decoding inside a real serving engine (vLLM first; SGLang and llama.cpp through
their own fields), seen from the outside through its OpenAI-compatible HTTP API.

records.py          one request as plain records (chunks, the engine's spec stats, derived rates)
client.py           one streamed completion: text chunk by chunk, timings, the engine's fields
urls.py             the one server-URL check (http(s) with a host) and the one loopback test
engines.py          reading vLLM / SGLang / llama.cpp per-request fields into records
steps.py            a stream cut into engine steps (a vLLM/SGLang chunk; llama.cpp's tokens by its counters)
state.py            why a run shows no drafting, for the engine in front of us (/metrics, llama.cpp's /slots)
speed.py            fair speed: decode-only rates where the engine gives them, speedups withheld when meaningless
prometheus.py       the server-wide `/metrics` counters, and their change over a run
generate_command.py `python -m specviz generate --server URL [--baseline-server URL2]`
bench_server.py     `python -m specviz bench --server URL --baseline-server URL2`
load.py             the multi-tenant sweep: closed-loop concurrency levels, speculation on and off
load_stats.py       its arithmetic: percentiles, crossover, the "speculate below C" policy
load_report.py      its JSON (specviz-load v1), table and HTML; load_chart.py its figure
load_command.py     `python -m specviz load`

No engine says which drafted token was rejected, so nothing here colours tokens: a step is a
group of tokens the server sent together, with how many drafts it kept.
figures.py          the serving view's figures and cards, from records
May import: core, modeling, render, run (its prompt suites); never the engine: the server does the decoding.
"""
