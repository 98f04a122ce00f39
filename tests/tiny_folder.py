"""A tiny, random, offline causal LM saved as an ordinary transformers folder.

    from tiny_folder import make_tiny_model_dir
    folder = make_tiny_model_dir(tmp_path / "tiny")            # a target
    drafter = make_tiny_model_dir(tmp_path / "draft", seed=1)  # same tokenizer, other weights

The tokenizer is trained in-process (no download) and is deterministic, so two folders
made with the same `vocab_words` and `style` have identical vocabularies whatever their
seeds. It has a ChatML chat template (like SmolLM2's) and `<|im_end|>` as its eos.
Loading a folder takes well under a second; building one about a second.
"""
from __future__ import annotations

import json
import pathlib

# Enough everyday words that short English prompts ("the cat sat on the mat") encode as
# whole-word tokens; any other text still encodes, byte by byte or piece by piece.
WORDS = tuple("""
the a an of to in on at and or but is was are were be been it its this that these those
he she they we you i my your our their his her him them me us cat dog mat sat ran big small
red blue green one two three four five six seven eight nine ten hello world yes no not
what who why how when where which can will would should could do does did have has had
say said go went come came see saw make made take took good bad new old first last long
little time day year way man woman child people thing word number water sun moon tree
house car book story code python function return print list data model token draft
""".split())

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def make_tiny_model_dir(path, vocab_words=WORDS, seed: int = 0, layers: int = 2,
                        style: str = "bytelevel") -> pathlib.Path:
    """Save a random LlamaForCausalLM (hidden 32) and its tokenizer into folder `path`.

    vocab_words: words the tokenizer learns as single tokens (the vocabulary is bytes or
        characters, these words and the merges between, plus the three ChatML specials).
    seed: the model's weights (the tokenizer does not depend on it).
    layers: number of decoder layers.
    style: "bytelevel" (GPT-2/SmolLM2-like BPE, any text encodes) or "metaspace"
        (SentencePiece-like BPE with '▁' for spaces, as in Llama 2 and Mistral).
    Returns the folder as a Path.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    path = pathlib.Path(path)
    tokenizer = _make_tokenizer(list(vocab_words), style)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos, pad_token_id=eos, tie_word_embeddings=False,
        # Larger than the usual 0.02 so next-token distributions are peaked, not nearly
        # uniform: greedy choices then do not hinge on float rounding between batch sizes.
        initializer_range=0.2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, pad_token_id=eos
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _make_tokenizer(words: list[str], style: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if style == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        unk = None
    elif style == "metaspace":
        tok = Tokenizer(models.BPE(unk_token="<|endoftext|>", byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
        alphabet = []
        unk = "<|endoftext|>"
    else:
        raise ValueError(f"style must be 'bytelevel' or 'metaspace', not {style!r}")
    trainer = trainers.BpeTrainer(
        vocab_size=10_000,  # far more than the words need: every word becomes one token
        special_tokens=list(SPECIALS), initial_alphabet=alphabet, show_progress=False,
    )
    # Each word with and without a leading space, several times, so each merges whole.
    corpus = [" ".join(words)] * 4 + [w for w in words for _ in range(4)]
    tok.train_from_iterator(corpus, trainer=trainer)
    if style == "metaspace":
        # Byte-fallback tokens <0x00>..<0xFF> let any character encode, as in Llama 2;
        # they must sit in the BPE model's own vocabulary, so rebuild it with them.
        state = json.loads(tok.to_str())["model"]
        vocab = dict(state["vocab"])
        for b in range(256):
            vocab.setdefault(f"<0x{b:02X}>", len(vocab))
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
        tok.model = models.BPE(vocab, merges, unk_token=unk, byte_fallback=True)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
        unk_token=unk, pad_token="<|im_end|>", chat_template=CHAT_TEMPLATE,
    )


def make_family_dir(path, family: str, seed: int = 0) -> pathlib.Path:
    """A tiny random model of `family` (specviz/matrix/families.py: Mistral, Gemma 3, GPT-OSS, ...)
    with the same tokenizer as make_tiny_model_dir, saved as an ordinary transformers folder."""
    from transformers import GenerationConfig

    from specviz.matrix.families import tiny_model

    path = pathlib.Path(path)
    tokenizer = _make_tokenizer(list(WORDS), "bytelevel")
    model = tiny_model(family, vocab=len(tokenizer), seed=seed)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos, "pad_token_id": eos}
    for name, value in ids.items():
        setattr(model.config, name, value)
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
