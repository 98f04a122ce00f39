"""The engines an audit draws from: each gives one short completion per seed, with the drafts
its speculation proposed and kept on the way, and says how it mapped the sampling settings.

    Local      specviz's own loop, speculative (any drafter) or plain
    Generate   transformers' `generate`: plain, prompt lookup or an assistant model
    Server     an OpenAI-compatible server (vLLM, llama.cpp, SGLang) through serving/client.py

A server sends text, not token ids: its draws are kept as the text of each streamed chunk when
every chunk held one token (llama.cpp, a plain vLLM), else as the completion's whole text. It is
asked for a few tokens more than are tested, since a server drafts no further than a request's
end (llama.cpp drafted nothing in 40 requests of 3 tokens on the audit's prompt).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..core.errors import SpecvizError
from ..core.events import RunEnd
from ..core.sampling import Processor, Sampling
from ..engine.generate import GenerationConfig, baseline_generate, speculative_generate
from ..modeling.forward import model_device, output_vocab_size
from ..serving.client import get_json, server_version, stream_completion

# The plain side's seeds start this far past the speculative side's: one seed both ways would tie
# the two samples together (a drafter that agrees makes both draw alike) and hide a difference.
PLAIN_SEEDS = 1_000_000


@dataclass(frozen=True)
class Draw:
    tokens: tuple | None  # the first tokens of the completion (ids; a server's chunk texts); None: unknown
    text: str = ""  # a server's completion as text (the outcome when tokens are unknown)
    drafted: int = 0  # draft tokens the speculation proposed while emitting them
    accepted: int = 0


class Local:
    """specviz's engine on a loaded model: `drafter` None draws plainly (baseline_generate). `cfg` is the
    run's configuration but for the seed: a speculative draw runs to cfg.max_new_tokens (room past
    `tokens` for a whole draft, so the first steps are not cut short), a plain one to `tokens`.
    `watch`, if given, sees every step of a speculative draw."""

    def __init__(self, model, drafter, prompt_ids: list[int], cfg: GenerationConfig, tokens: int,
                 label: str = "specviz", watch=None):
        self.model, self.drafter, self.prompt, self.cfg = model, drafter, list(prompt_ids), cfg
        self.tokens, self.label, self.watch = tokens, label, watch or (lambda step: None)

    def settings(self) -> dict:
        shown = {k: v for k, v in self.cfg.sampling.__dict__.items() if k != "seed"}  # each draw has its own
        return {"engine": "specviz", **shown, "k": self.cfg.k, "verification": self.cfg.verification,
                "mapping": "the settings as given (the engine's own sampler)"}

    def draw(self, seed: int) -> Draw:
        cfg = replace(self.cfg, sampling=replace(self.cfg.sampling, seed=seed))
        if self.drafter is None:
            *_, end = baseline_generate(self.model, self.prompt, replace(cfg, max_new_tokens=self.tokens))
            return Draw(tuple(end.token_ids))
        out, drafted, accepted = [], 0, 0
        events = speculative_generate(self.model, self.drafter, self.prompt, cfg, remember=False)
        for ev in events:
            if isinstance(ev, RunEnd):
                break  # the run stopped (end of turn) before `tokens`
            self.watch(ev)
            out += ev.emitted
            drafted += len(ev.draft)
            accepted += ev.accepted
            if len(out) >= self.tokens:
                events.close()
                break
        return Draw(tuple(out[:self.tokens]), drafted=drafted, accepted=accepted)


def config(sampling: Sampling, tokens: int, k: int = 4, eos: tuple[int, ...] = (), verification: str = "token",
           room: int | None = None, **rules) -> GenerationConfig:
    """The audit's configuration: nothing recorded for views, `room` past `tokens` (default k, for one draft:
    a tree's whole first step needs its nodes' worth), `rules` as a run's."""
    return GenerationConfig(max_new_tokens=tokens + (k if room is None else room), k=k, sampling=sampling,
                            eos_token_ids=eos, top=0, raw_top=0, verification=verification, **rules)


def pair(model, drafter, prompt_ids: list[int], cfg: GenerationConfig, tokens: int, peer: str | None = None,
         extra: dict | None = None, watch=None) -> tuple:
    """(speculative, plain) engines drawing `tokens` tokens from one loaded target: specviz's loop with `drafter`, or
    given a peer, generate (`drafter`: its assistant or None, `extra` its options) speculating to cfg.max_new_tokens."""
    if peer:
        s, k, eos = cfg.sampling, cfg.k, cfg.eos_token_ids
        return (Generate(model, peer, prompt_ids, s, cfg.max_new_tokens, k, eos, drafter, extra),
                Generate(model, "hf", prompt_ids, s, tokens, k, eos))
    return Local(model, drafter, prompt_ids, cfg, tokens, watch=watch), Local(model, None, prompt_ids, cfg, tokens)


def target_p(model, context: list[int], sampling: Sampling) -> torch.Tensor:
    """The distribution plain sampling draws the token after `context` from: the target's processed p."""
    with torch.inference_mode():
        logits = model(torch.tensor([context], device=model_device(model))).logits[0, -1:]
    return Processor(sampling, output_vocab_size(model), context, logits.device).probs(logits)[0]


def draws(engines, n: int, first_seed: int = 0, stop=lambda: False):
    """The one way every exactness check draws: seed by seed, one draw from each engine in turn (a
    busy machine slows them alike), engine j's seeds PLAIN_SEEDS * j past the first's; yields each
    round's draws as a tuple, n rounds or until stop() says so before one."""
    for i in range(n):
        if stop():
            return
        yield tuple(e.draw(first_seed + j * PLAIN_SEEDS + i) for j, e in enumerate(engines))


class _Counting:
    """A transformers candidate generator that counts what it proposes and what is kept."""

    def __init__(self, inner, counts: list[int]):
        self._inner, self._counts = inner, counts

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def get_candidates(self, input_ids, **kwargs):
        ids, logits = self._inner.get_candidates(input_ids, **kwargs)
        self._counts[0] += ids.shape[1] - input_ids.shape[1]
        return ids, logits

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        self._counts[1] += int(num_matches)
        return self._inner.update_candidate_strategy(input_ids, scores, num_matches)


class Generate:
    """transformers' `generate` on the same model: peer "hf" (plain), "hf-pld" (prompt lookup,
    `prompt_lookup_num_tokens`) or "hf-assisted" (`assistant_model`); `extra` goes to generate as
    given (e.g. `assistant_ensemble_weight`, its lossy DIVERSE verification). Seeds torch's global
    generator per draw, as a user of generate does."""

    def __init__(self, model, peer: str, prompt_ids: list[int], sampling: Sampling, tokens: int, k: int = 4,
                 eos: tuple[int, ...] = (), assistant=None, extra: dict | None = None):
        from ..bench.peers import generate_kwargs

        self.model, self.peer, self.prompt, self.tokens = model, peer, list(prompt_ids), tokens
        self.sampling, self.extra = sampling, dict(extra or {})
        self.kwargs = generate_kwargs(peer, k, False, sampling, tokens, eos, assistant)
        # top_k=None would leave a model's own generation_config default in force (often 50): 0 is off.
        self.kwargs.update(top_k=sampling.top_k, **self.extra)
        self.label = {"hf": "transformers generate", "hf-pld": "transformers prompt lookup",
                      "hf-assisted": "transformers assisted"}[peer]

    def settings(self) -> dict:
        import transformers

        shown = {k: v for k, v in self.kwargs.items() if k not in ("assistant_model", "eos_token_id", "pad_token_id")}
        return {"engine": "transformers", "version": transformers.__version__, "peer": self.peer, **shown,
                "mapping": "temperature, top_k (0 = off), top_p and repetition_penalty passed one to one; the "
                           "same order of processing (penalty, temperature, top-k, top-p); torch.manual_seed(seed)"}

    def draw(self, seed: int) -> Draw:
        from ..bench.peers import run_peer

        counts = [0, 0]
        # generate() builds its candidate generator per call: wrap that one call's, on this model
        # instance only (the class keeps its own; draws never run two at once on one model).
        choose = self.model._get_candidate_generator
        self.model._get_candidate_generator = lambda *a, **kw: _Counting(choose(*a, **kw), counts)
        try:
            ids, _ = run_peer(self.model, self.prompt, self.kwargs, seed)
        finally:
            del self.model._get_candidate_generator  # the class's own again
        return Draw(tuple(ids[:self.tokens]), drafted=counts[0], accepted=counts[1])


def server_params(sampling: Sampling, window: int | None = None) -> dict:
    """The request's sampling fields, under the names vLLM and llama.cpp's servers read (each
    ignores the other's). top-k -1 and min-p 0 switch those samplers off in both (llama.cpp's own
    defaults are top-k 40, min-p 0.05). llama.cpp's penalty looks at its last `repeat_last_n`
    tokens only (64 by default; its builds of 2026 refuse -1, "the whole context"), so with a
    penalty on it is sent `window`, the server's context size."""
    params = {"top_k": sampling.top_k or -1, "top_p": sampling.top_p, "min_p": 0.0,
              "repetition_penalty": sampling.repetition_penalty, "repeat_penalty": sampling.repetition_penalty}
    if window and sampling.repetition_penalty != 1:
        params["repeat_last_n"] = window
    return params


class Server:
    """An OpenAI-compatible server, one streamed chat completion per draw."""

    def __init__(self, url: str, messages: list[dict], sampling: Sampling, tokens: int, model: str | None = None,
                 room: int = 4):
        self.url, self.messages, self.sampling, self.tokens, self.model = url, messages, sampling, tokens, model
        self.room = room  # tokens asked for past the tested ones: a server drafts no further than the request's end
        self.label, self.engine, self._version, self._window = url, None, False, False

    @property
    def window(self) -> int | None:
        """The context size llama.cpp's /props reports (for its penalty's window), asked once; None
        without a penalty or from another server."""
        if self._window is False:
            self._window = None
            if self.sampling.repetition_penalty != 1:
                try:
                    self._window = get_json(self.url, "/props").get("default_generation_settings", {}).get("n_ctx")
                except (SpecvizError, AttributeError):
                    pass
        return self._window

    @property
    def version(self) -> str | None:
        """What the server says it is (client.server_version), asked once."""
        if self._version is False:
            self._version = server_version(self.url)
        return self._version

    def settings(self) -> dict:
        return {"engine": self.engine or "server", "version": self.version or "not told (neither /props nor /version)",
                "url": self.url, "max_tokens": self.tokens + self.room, "temperature": self.sampling.temperature,
                **server_params(self.sampling, self.window), "seed": "the draw's",
                "mapping": "the request's own fields (vLLM and llama.cpp names both sent); a server-side "
                           "default the request cannot reach is not seen here"}

    def draw(self, seed: int) -> Draw:
        run = stream_completion(self.url, "", model=self.model, max_tokens=self.tokens + self.room,
                                temperature=self.sampling.temperature, seed=seed, messages=self.messages,
                                params=server_params(self.sampling, self.window))
        if run.error:
            raise SpecvizError(run.error)
        self.model, self.engine = run.model, run.engine or self.engine
        one_each = run.chunks and all(c.tokens == 1 for c in run.chunks)
        tokens = tuple(c.text for c in run.chunks[:self.tokens]) if one_each else None
        spec = run.spec
        return Draw(tokens, run.text, spec.drafted if spec else 0, spec.accepted if spec else 0)


def served(urls, messages: list[dict], sampling: Sampling, tokens: int, model: str | None = None, room: int = 4):
    """One Server per url, alike but for the url (the speculative one first)."""
    return tuple(Server(url, messages, sampling, tokens, model, room) for url in urls)


def outcomes(draws: list[Draw], tokens: int) -> tuple[list[tuple], int]:
    """(one outcome per draw, the depth to test): the first tokens, or, when any draw's tokens
    are unknown (a server that sent several per chunk), each completion's whole text at depth 1."""
    if all(d.tokens is not None for d in draws):
        return [tuple(d.tokens) for d in draws], tokens
    return [(d.text,) for d in draws], 1
