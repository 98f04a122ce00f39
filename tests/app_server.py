"""The app, served in-process on a free local port with tiny offline models (for the app tests).

    with serve_app(tmp_dir) as (url, folders): ...

The target is tests/tiny_folder.py's random model; the draft model is a lightly perturbed
copy of it with the same tokenizer, so a greedy run shows every token kind (accepted,
rejected, corrected, bonus) within a couple of dozen tokens.
"""
from __future__ import annotations

import contextlib
import pathlib
import shutil
import socket
import time

import pytest
from tiny_folder import make_tiny_model_dir

DRAFT_NOISE = 0.02  # relative weight noise: ~0.7 acceptance at k=4 on the test prompt
PROMPT = "the cat sat on the mat. the cat sat on the mat. the dog ran & <b>said</b>"


def make_app_models(root: pathlib.Path) -> dict[str, str]:
    """A tiny target and its noisy-copy draft model as folders under `root` (made once)."""
    import torch
    from transformers import AutoModelForCausalLM

    target, draft = root / "tiny-target", root / "tiny-draft"
    if not (draft / "config.json").is_file():
        make_tiny_model_dir(target)
        model = AutoModelForCausalLM.from_pretrained(target)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(1)
            for w in model.parameters():
                w.add_(torch.randn_like(w) * DRAFT_NOISE * w.std())
        model.save_pretrained(draft)
        for f in target.iterdir():  # the same tokenizer files
            if f.is_file() and not f.name.endswith((".safetensors", "config.json")):
                shutil.copy(f, draft / f.name)
    heads = {kind: root / f"tiny-{kind}.safetensors" for kind in ("medusa", "eagle", "block")}
    for kind, path in heads.items():
        if not path.is_file():
            _save_random_head(kind, target, path)
    return {"target": str(target), "draft": str(draft), **{kind: f"{kind}:{path}" for kind, path in heads.items()}}


def _save_random_head(kind: str, target_dir: pathlib.Path, path: pathlib.Path) -> None:
    """Medusa heads, an EAGLE head or a block drafter with random weights for the tiny target: they draft trees."""
    import torch

    from specviz.drafters.eagle import EagleHead, eagle_config
    from specviz.drafters.medusa import MedusaHeads, heads_config
    from specviz.drafters.trained import save_drafter
    from specviz.modeling.models import load

    target = load(str(target_dir), device="cpu", dtype="fp32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        if kind == "eagle":
            config = eagle_config(target.model)
            save_drafter(path, "eagle", EagleHead(config, None), config, target)
            return
        if kind == "block":
            from specviz.drafters.block import BlockHead, block_config

            config = block_config(target.model, 8)
            save_drafter(path, "block", BlockHead(config, None), config, target)
            return
        heads = MedusaHeads(target.model.config.hidden_size, 3, None)
        for block in heads.blocks:
            torch.nn.init.normal_(block.weight, std=0.3)
    save_drafter(path, "medusa", heads, heads_config(heads), target)


@pytest.fixture(scope="session")
def app_models(tmp_path_factory) -> dict[str, str]:
    """Import into a test module to use: the tiny target and draft model folders, made once per session."""
    return make_app_models(tmp_path_factory.getbasetemp() / "app-models")


def app_policy(folders: dict[str, str], **overrides):
    from specviz.ui import Policy

    base = dict(
        targets=(("tiny target", folders["target"]),),
        drafters=(("none", "none"), ("prompt lookup", "prompt lookup"), ("tiny draft model", folders["draft"]),
                  ("tiny medusa", folders["medusa"])),
        default_target=folders["target"], default_drafter=folders["draft"],
        compare_drafters=("prompt lookup", folders["draft"]), max_new_tokens=400,
    )
    base.update(overrides)
    return Policy(**base)


def slow_prefill(monkeypatch, chunk: int = 4, seconds: float = 0.35, read: list | None = None) -> None:
    """The app's speculative runs read their prompt `chunk` tokens a forward, each chunk taking
    `seconds` more, so a status heartbeat (every second from the second on) sees the prefill's progress.
    `read`: a list each chunk read appends its count of tokens read so far to."""
    import specviz.engine.generate as generate
    from specviz.run import race

    monkeypatch.setattr(generate, "PREFILL_CHUNK", chunk)
    real = race.speculative_generate

    def told(done, total, on_prefill):
        time.sleep(seconds)
        if read is not None:
            read.append(done)
        on_prefill(done, total)

    def slow(*args, on_prefill, **kwargs):
        return real(*args, on_prefill=lambda done, total: told(done, total, on_prefill), **kwargs)

    monkeypatch.setattr(race, "speculative_generate", slow)


def slow_steps(monkeypatch, seconds: float = 0.1) -> None:
    """Every event of the app's runs (plain and speculative) comes `seconds` later, so a status the
    page shows while the runs go on stays up long enough for a browser to read it."""
    from specviz.run import race

    def slowed(real):
        def run(*args, **kwargs):
            for event in real(*args, **kwargs):
                time.sleep(seconds)
                yield event
        return run

    for name in ("speculative_generate", "baseline_generate"):
        monkeypatch.setattr(race, name, slowed(getattr(race, name)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_app(policy, examples=None, models=None, engines=None):
    """Launch build_app(policy) on 127.0.0.1:<free port>; yield its URL; close it afterwards.
    `engines`: fake serving-engine functions for the Serving engine tab (ui/serving.py)."""
    from specviz.ui import build_app, launch_options

    demo = build_app(policy, models=models, examples=examples, engines=engines)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **launch_options())
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()
