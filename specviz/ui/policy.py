"""What this deployment allows (Policy): which models visitors may pick, and how much load
one visitor may put on the machine.

Local mode (`python app.py` on loopback) trusts its one user: any model, any path. Hosted
mode serves strangers: on a Hugging Face Space (SPACE_ID is set there), with
SPECVIZ_HOSTED=1, or when strangers can reach a local app (listening beyond loopback, or
shared through a gradio.live link) unless its operator trusts every visitor
(--trust-visitors or SPECVIZ_TRUST_VISITORS=1). There models come only from an allow-list
(no paths, so no error can tell whether a path exists; never remote code), the targets
offered are those that fit the machine's memory, loaded models are dropped least recently
used under a memory budget, and prompts, new tokens, run time, the line of waiting runs and
each visitor's runs are capped. The checks run on the server, so a script calling the API
meets the same rules as the page.

Serving engines (the "Serving engine" tab) are reached by URL, so a hosted app talks only
to the ones its operator named (--server / --baseline-server, $SPECVIZ_SERVER_URL /
$SPECVIZ_BASELINE_SERVER_URL): a visitor who could type a URL could make this machine send
requests anywhere it can reach (server-side request forgery). Locally any http(s) URL goes.
"""
from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, replace
from typing import Mapping

from ..core.errors import SpecvizError
from ..drafters.suffix_memory import DEFAULT_TOKENS
from ..render.status import MB
from ..run.spec import NONE, parse
from ..serving.urls import check_url, is_loopback
from ..run.settings import Settings

# The sweep measured for the README (vLLM on a 2-core CPU, ngram on and off): the Serving engine
# tab shows it until an operator names another, so the trade-off is visible with no server.
MEASURED_LOAD = pathlib.Path(__file__).resolve().parents[2] / "assets" / "serving" / "load-cpu.json"

# (label shown, value passed to the loader). "default" is the embedded SmolLM2-135M-Instruct,
# the one model that needs no Hugging Face Hub; the others share its tokenizer.
TARGETS = (
    # Short labels: the menu is as wide as the settings column (the '-Instruct' ones were cut off).
    ("SmolLM2-135M (embedded)", "default"),
    ("SmolLM2-360M (Hub)", "HuggingFaceTB/SmolLM2-360M-Instruct"),
    ("SmolLM2-1.7B (Hub)", "HuggingFaceTB/SmolLM2-1.7B-Instruct"),
)
PARAMETERS = {"default": 134.5e6, "HuggingFaceTB/SmolLM2-360M-Instruct": 362e6,
              "HuggingFaceTB/SmolLM2-1.7B-Instruct": 1.71e9}  # to judge fit before downloading
# Each drafter's menu label starts with the name Compare's table and the panel titles give it
# (run/spec.py's DrafterSpec.label), then says in brackets what it does.
DRAFTERS = tuple((f"{parse(value).label} ({what})", value) for value, what in (
    (NONE, "plain steps"),
    (Settings.drafter, "copy n-grams from the context"),
    ("layerskip", "the target drafts with ~70% of its layers"),
    ("eagle", "a head trained for the embedded model"),
    ("eagle+pld", "copy where the text repeats"),
    ("suffix", "copy from this prompt and your earlier answers"),
    ("suffix+eagle", "EAGLE where no match is sure"),
    ("medusa", "heads trained for the embedded model"),
    ("draft", "trained for the embedded model"),
)) + ((parse("default").label, "default"),)
# The offered drafters that give q, whose drafts the two verification rules judge differently: Compare
# offers each once more as NAME@token, the old rule beside the default (a hosted page cannot type it).
# "block" joins DRAFTERS and compare_drafters once its trained file ships in assets/ (issue 63): without
# it the name is refused in a sentence, as any trained kind with no shipped file.
RULED = ("layerskip", "eagle", "medusa", "block", "draft")
MODEL_SHARE = 0.5  # of the machine's memory for models; the rest is Python, Gradio and the OS
RESIDENT_PER_WEIGHT_BYTE = 3.5  # peak RSS / weights, measured on the embedded model with EAGLE: weights, q/k/v and gate/up
# copies and the kernels' packed copies (packing.py), libraries, activations and KV caches
CHARS_PER_TOKEN = 16  # more characters than this per allowed token is refused before tokenizing
TRUE = ("1", "true", "yes")
MAX_TRACE_BYTES = 32 * MB  # the largest trace file any deployment replays (and Gradio's upload limit)
HOSTED_TRACE_BYTES = 8 * MB  # docs/hosting.md says "8 MB": the page says the same (render.status.megabytes)
HOSTED_MEMORY_TOKENS = 8192  # a hosted visitor's suffix memory: 32 answers of 256 tokens


@dataclass(frozen=True)
class Policy:
    """What this deployment lets visitors choose, and the load one run may put on it."""

    hosted: bool = False
    targets: tuple = TARGETS  # (label, value) pairs offered in the page
    drafters: tuple = DRAFTERS
    default_target: str = "default"
    default_drafter: str = Settings.drafter  # the best drafter that works offline
    compare_drafters: tuple[str, ...] = (Settings.drafter, "suffix", "eagle", "eagle+pld", "medusa", "draft")
    max_new_tokens: int = 1024
    max_prompt_tokens: int | None = None  # None: the model's context is the limit
    max_run_seconds: float | None = None  # a run past it stops, keeping what it produced
    concurrency: int = 1  # runs at once; more than one would make the timings lie
    max_waiting: int = 16  # runs waiting for a turn; one more is told the app is busy
    runs_per_visitor: int | None = None  # running or waiting, per browser tab or API client
    model_bytes: int | None = None  # weights kept loaded, least recently used dropped; None: all
    max_trace_bytes: int = MAX_TRACE_BYTES  # a trace file uploaded to replay (a 1,024-token run is a few MB)
    server_url: str = ""  # the operator's serving engine with speculation ("": none named)
    baseline_server_url: str = ""  # the operator's plain (no speculation) engine, to compare against
    load_result: str = ""  # the operator's load-sweep JSON, shown in the Serving engine tab
    # Suffix decoding's memory of a visitor's earlier answers (handlers.Session), in tokens; the
    # oldest answers go first. Hosted: a few dozen answers, ~1 MB a visitor.
    suffix_memory_tokens: int = DEFAULT_TOKENS
    # Allow-listed targets left out because they would not fit this machine's memory: (label, value,
    # bytes of weights), so refusing one says it is memory, not only that it is not on the list.
    too_big: tuple = ()

    @property
    def compare_choices(self) -> tuple:
        """The Compare tab's drafters: every offered one, then those that give q judged token by token."""
        return self.drafters + tuple((f"{label}, token by token", f"{value}@token")
                                     for label, value in self.drafters if value in RULED)

    def _allowed(self, name: str, pairs) -> bool:
        return name in {value for _, value in pairs}

    def check(self, s: Settings) -> None:
        """Raise SpecvizError if these settings are not allowed here."""
        self.check_size(s)
        if not self.hosted:
            return
        big = {value: (label, need) for label, value, need in self.too_big}
        if s.target in big:
            label, need = big[s.target]
            raise SpecvizError(f"{label} is not offered here for lack of memory: its weights take "
                               f"{gigabytes(need)} and this machine keeps {gigabytes(self.model_bytes or 0)} of its "
                               f"memory for model weights; choose {' or '.join(lab for lab, _ in self.targets)}")
        if not self._allowed(s.target, self.targets):
            names = ", ".join(v for _, v in self.targets)
            raise SpecvizError(f"this hosted app only runs these targets: {names} (got {s.target!r})")
        self.check_drafter(s.drafter)

    def check_size(self, s: Settings) -> None:
        """The caps on one run's prompt and new tokens, whoever runs it (a local model or a server)."""
        if s.max_new_tokens > self.max_new_tokens:
            raise SpecvizError(f"max new tokens is capped at {self.max_new_tokens} here, got {s.max_new_tokens}")
        if self.max_prompt_tokens and len(s.prompt) > self.max_prompt_tokens * CHARS_PER_TOKEN:
            raise SpecvizError(f"the prompt is {len(s.prompt):,} characters: this app takes prompts of up to "
                               f"{self.max_prompt_tokens:,} tokens")

    def check_drafter(self, name: str) -> None:
        if self.hosted and not self._allowed(name, self.drafters):
            names = ", ".join(v for _, v in self.drafters)
            raise SpecvizError(f"this hosted app only offers these drafters: {names} (got {name!r})")

    def check_server(self, url, role: str = "server") -> str:
        """`url`, stripped, if a run may send requests there; else SpecvizError with a sentence.

        Hosted: only the operator's URLs (so no visitor can point this machine at another
        address); local: any http(s) URL."""
        url = "" if url is None else str(url).strip()
        if not url:
            raise SpecvizError(f"give the {role} URL (for example http://127.0.0.1:8000)")
        if self.hosted:
            named = {u.strip().rstrip("/"): u.strip() for u in (self.server_url, self.baseline_server_url) if u.strip()}
            if not named:
                raise SpecvizError("this hosted app has no serving engine: its operator names one with "
                                   "`python app.py --server URL`")
            if url.rstrip("/") not in named:
                raise SpecvizError(f"this hosted app only sends requests to the serving engines its operator "
                                   f"named (shown in the URL fields), not to the {role} URL given")
            return named[url.rstrip("/")]  # the operator's own spelling of it
        return check_url(url, f"the {role} URL")

    def check_load_path(self, path) -> str:
        """A load-sweep file named by path: any when visitors are trusted, else the operator's only."""
        path = "" if path is None else str(path).strip()
        if not path:
            raise SpecvizError("give the path of a load-sweep JSON file (python -m specviz load writes one)")
        if self.hosted and path != self.load_result.strip():
            raise SpecvizError("this hosted app reads no files by path: upload the load-sweep JSON instead")
        return path

    def check_prompt_tokens(self, n: int) -> None:
        if self.max_prompt_tokens and n > self.max_prompt_tokens:
            raise SpecvizError(f"the prompt is {n:,} tokens: this app takes prompts of up to "
                               f"{self.max_prompt_tokens:,} tokens, so shorten it")


def gigabytes(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def memory_limit() -> int:
    """Bytes of memory this process may use: the machine's RAM, or its container's limit if lower."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = pathlib.Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits) if limits else 16 << 30


def weights_bytes(target: str) -> float | None:
    """The bytes an allow-listed target's weights take in the dtype this machine loads it in."""
    from ..modeling.models import pick_device, pick_dtype

    params = PARAMETERS.get(target)
    return None if params is None else params * pick_dtype(pick_device()).itemsize


def hosted_policy(memory: int | None = None, **overrides) -> Policy:
    """The policy for strangers on a machine with `memory` bytes (default: this one's).

    The embedded target is always offered; another only if its weights fit the budget.
    """
    memory = memory_limit() if memory is None else memory
    budget = int(memory * MODEL_SHARE / RESIDENT_PER_WEIGHT_BYTE)
    fits = lambda name: name == "default" or (weights_bytes(name) or 0) <= budget  # noqa: E731
    targets = tuple((label, name) for label, name in TARGETS if fits(name))
    too_big = tuple((label, name, int(weights_bytes(name))) for label, name in TARGETS if not fits(name))
    policy = Policy(hosted=True, targets=targets, too_big=too_big, max_new_tokens=256, max_prompt_tokens=1024,
                    max_run_seconds=90, concurrency=1, max_waiting=8, runs_per_visitor=1, model_bytes=budget,
                    max_trace_bytes=HOSTED_TRACE_BYTES, suffix_memory_tokens=HOSTED_MEMORY_TOKENS)
    return replace(policy, **overrides)


def exposed(host: str | None, share: bool = False) -> bool:
    """Can strangers reach the app: a public share link, or listening beyond loopback?"""
    return share or not is_loopback(host or "127.0.0.1")  # a host name other than localhost may be anything


def policy_from_env(environ: Mapping[str, str] = os.environ, host: str | None = None, share: bool = False,
                    trust_visitors: bool | None = None) -> Policy:
    """Hosted on a Space (SPACE_ID), with SPECVIZ_HOSTED=1, or when the app is exposed (`host`,
    default $GRADIO_SERVER_NAME, beyond loopback, or `share`) and visitors are not trusted
    (`trust_visitors`, default $SPECVIZ_TRUST_VISITORS). The serving engines' URLs and a
    load-sweep file come from $SPECVIZ_SERVER_URL, $SPECVIZ_BASELINE_SERVER_URL and
    $SPECVIZ_LOAD_RESULT."""
    engines = dict(server_url=environ.get("SPECVIZ_SERVER_URL", "").strip(),
                   baseline_server_url=environ.get("SPECVIZ_BASELINE_SERVER_URL", "").strip(),
                   load_result=environ.get("SPECVIZ_LOAD_RESULT", "").strip() or str(MEASURED_LOAD))
    if environ.get("SPACE_ID") or environ.get("SPECVIZ_HOSTED", "").strip().lower() in TRUE:
        return hosted_policy(**engines)
    if trust_visitors is None:
        trust_visitors = environ.get("SPECVIZ_TRUST_VISITORS", "").strip().lower() in TRUE
    if exposed(host if host is not None else environ.get("GRADIO_SERVER_NAME"), share) and not trust_visitors:
        return hosted_policy(**engines)
    return Policy(**engines)
