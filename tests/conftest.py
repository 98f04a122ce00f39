"""Tiny randomly initialised models, built in-process: the engine's tests need no download."""
from __future__ import annotations

import itertools
import os
import time

# No test may need the Hugging Face Hub; offline mode also makes a Hub miss fail at once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# The tiny models' ops are far too small to split across threads; on a shared 2-core machine
# two threads per op made tests 10-27x slower (contention). The embedded-model tests choose
# their own. SPECVIZ_THREADS keeps the CLI run in-process (and the app and CLI run as
# subprocesses) at one thread too.
torch.set_num_threads(1)
os.environ.setdefault("SPECVIZ_THREADS", "1")
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab: int = 96, layers: int = 2, hidden: int = 64, seed: int = 0, context: int = 256):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    # Random init gives near-uniform logits; sharpen them so greedy choices have margins
    # and sampled distributions are far from uniform, like a trained model's.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def noisy_copy(model, scale: float, seed: int = 1):
    """The same architecture with perturbed weights: a drafter that agrees only partly."""
    torch.manual_seed(seed)
    clone = LlamaForCausalLM(model.config).eval()
    clone.load_state_dict(model.state_dict())
    with torch.no_grad():
        for w in clone.parameters():
            w.add_(torch.randn_like(w) * scale * w.std())
    return clone


@pytest.fixture
def fake_clock(monkeypatch):
    """perf_counter advances 1 ms per call: dynamic k sees steady, repeatable costs, whatever else
    the machine is doing (a test of dynamic k on real timings drafts differently under load)."""
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 1e-3)


@pytest.fixture(scope="session")
def _smol_loaded():
    from specviz.modeling.models import load

    return load("default", device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def smol(_smol_loaded):
    """The real embedded SmolLM2-135M-Instruct (fp32, CPU), loaded once per test process."""
    from specviz.modeling import threads

    before = torch.get_num_threads()
    # What the app would choose here without SPECVIZ_THREADS (the tiny tests keep 1, restored
    # after the module): a real model's multiplies do use more cores, but not one a neighbour keeps busy.
    torch.set_num_threads(threads.choose(threads.usable_cores(), os.getloadavg()[0], role="app"))
    yield _smol_loaded
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def prompts():
    g = torch.Generator().manual_seed(123)
    return [torch.randint(0, 96, (n,), generator=g).tolist() for n in (1, 5, 17, 40)]


# Tests against a real vLLM server (tests/test_vllm_server.py) cost minutes: vLLM for CPU installs
# once (~10 min, 3.5 GB, scripts/serve-vllm.sh --install-only) and each server takes ~3 min to
# start. They run only when asked: `python -m pytest --vllm -m vllm` (or SPECVIZ_VLLM_TESTS=1).
# The same for a real llama.cpp server (tests/test_llamacpp_server.py): llama-server builds once
# (~9 min) and starts in seconds; `python -m pytest --llamacpp -m llamacpp` (or SPECVIZ_LLAMACPP_TESTS=1).
LANES = {"vllm": "starts real vLLM servers (minutes): run with --vllm -m vllm",
         "llamacpp": "starts real llama.cpp servers (a first run builds one, ~9 min): run with --llamacpp -m llamacpp"}


def pytest_addoption(parser):
    parser.addoption("--vllm", action="store_true", help="run the tests that start real vLLM servers")
    parser.addoption("--llamacpp", action="store_true", help="run the tests that start real llama.cpp servers")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than the cores this process may use, at most 4. The browser tests
    spend much of their time waiting on the page (frames, Gradio's queue), and a third worker on
    2 cores fills those waits: the whole suite took 356 s instead of 404 s on a quiet 2-vCPU AMD EPYC
    (2026-12-07), every test passing."""
    from specviz.modeling import threads

    return min(threads.usable_cores() + 1, 4)


def pytest_collection_modifyitems(config, items):
    # Long work first: each browser module runs whole on one worker (its xdist_group), so one that
    # started last kept a worker busy while the other sat idle (~140 s of two workers' time in a
    # 348 s run); started first, the many short tests fill in around them. The order is stable
    # within each rank, so modules keep their own order.
    def rank(item):
        return 0 if item.get_closest_marker("xdist_group") else 1 if item.get_closest_marker("slow") else 2
    items.sort(key=rank)
    for lane, reason in LANES.items():
        if config.getoption(f"--{lane}") or os.environ.get(f"SPECVIZ_{lane.upper()}_TESTS") == "1":
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if lane in item.keywords:
                item.add_marker(skip)
