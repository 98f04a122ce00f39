"""What the first GPU run (an H200, with transformers 5.17 in its image) found: the engine must work
with every transformers it accepts, load models on CUDA offline, and survive kernels that hand
attention back in another memory layout."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_llama
from specviz.matrix.families import tiny_model
from specviz.core.errors import SpecvizError
from specviz.modeling import llama_fast, models, probe
from specviz.modeling.forward import _cache_keyword, forward, new_cache, transformers_problem
from tiny_folder import make_tiny_model_dir


def test_a_model_that_takes_its_cache_as_past_key_values_gets_it_there():
    # transformers before 5.24 (and remote code written for it) names the cache past_key_values; a
    # model given cache= swallowed it in **kwargs and ran every forward without its context.
    model = tiny_model("qwen3")  # the transformers path (not llama_fast)
    base = type(model)

    class OldNames(base):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, logits_to_keep=0, **kwargs):
            kwargs.pop("cache", None)  # as an old forward ignores a name it does not know
            return base.forward(self, input_ids=input_ids, cache=past_key_values, use_cache=use_cache,
                                logits_to_keep=logits_to_keep, **kwargs)

    model.__class__ = OldNames
    assert _cache_keyword(OldNames.forward) == "past_key_values"
    assert _cache_keyword(base.forward) == "cache"
    assert probe.problem(model) is None  # two parts in the cache reproduce one forward
    ids = torch.arange(3, 23) % 128
    with torch.inference_mode():
        whole = model(input_ids=ids[None]).logits[0]
        cache = new_cache(model)
        parts = torch.cat([forward(model, ids[:12], cache), forward(model, ids[12:], cache)])
    torch.testing.assert_close(parts, whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("version,refused", [("5.17.0", True), ("5.0.0", True), ("4.57.1", True),
                                             ("5.18.0", False), ("5.25.0", False), ("5.26.0.dev0", False),
                                             ("6.0.0", False)])
def test_a_transformers_too_old_for_sliding_rollback_is_named(version, refused):
    problem = transformers_problem(version)
    assert (problem is not None) == refused
    if refused:
        assert version in problem and "pip install -U 'transformers>=5.18,<6'" in problem


def test_requirements_ask_for_the_transformers_the_engine_needs():
    lines = open(os.path.join(os.path.dirname(__file__), "..", "requirements.txt")).read().splitlines()
    assert "transformers>=5.18,<6" in lines
    assert transformers_problem() is None  # the one installed here


def test_loading_turns_hub_kernels_off_unless_remote_code_is_allowed(tmp_path, monkeypatch):
    # On CUDA with the kernels package, transformers 5.25 fetched kernels-community/rotary from the
    # Hub while loading any Llama: code nobody allowed, and offline every load failed.
    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    folder = make_tiny_model_dir(tmp_path / "m", seed=3)
    models.load(str(folder), device="cpu")
    assert os.environ["USE_HUB_KERNELS"] == "NO"
    monkeypatch.setenv("USE_HUB_KERNELS", "YES")  # a user's own choice stands
    models.load(str(folder), device="cpu", dtype="bf16")
    assert os.environ["USE_HUB_KERNELS"] == "YES"


def test_a_hub_kernel_trust_error_is_not_called_remote_model_code():
    kernel = ValueError("Kernel repository 'kernels-community/rotary' could not verify publisher trust status. "
                        "Set trust_remote_code=True or add the repository ID to the trust_remote_code allowlist")
    said = models._load_failure("/models/llama", True, kernel)
    assert "needs code from its own repository" not in said
    assert "ValueError: Kernel repository 'kernels-community/rotary'" in said
    remote = ValueError("The repository /models/x contains custom code which must be executed to correctly load "
                        "the model. Please pass the argument `trust_remote_code=True` to allow custom code to be run.")
    assert "needs code from its own repository" in models._load_failure("/models/x", True, remote)


def test_fast_path_takes_attention_output_in_any_memory_layout(monkeypatch):
    # CUDA's attention kernels returned (batch, heads, tokens, dim) with the tokens axis outermost;
    # a .view() of it failed, so the probe refused every Llama-layout model on the GPU.
    model = tiny_llama(seed=4)
    assert llama_fast.supports(model)
    ids = torch.arange(1, 30) % 96
    with torch.inference_mode():
        want = forward(model, ids, new_cache(model))
    sdpa = F.scaled_dot_product_attention

    def strided(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        return out.transpose(1, 2).contiguous().transpose(1, 2)  # same values, tokens-major memory

    monkeypatch.setattr(llama_fast.F, "scaled_dot_product_attention", strided)
    with torch.inference_mode():
        got = forward(model, ids, new_cache(model))
    assert not strided(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4)).is_contiguous()
    torch.testing.assert_close(got, want)


def test_an_old_transformers_is_refused_before_a_load(monkeypatch, tmp_path):
    monkeypatch.setattr("transformers.__version__", "5.17.0")
    transformers_problem.cache_clear()
    try:
        with pytest.raises(SpecvizError, match="needs transformers 5.18 or newer"):
            models.load(str(make_tiny_model_dir(tmp_path / "old", seed=5)), device="cpu")
    finally:
        transformers_problem.cache_clear()
