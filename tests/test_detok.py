"""Token text as a reader sees it: whole characters only, in the panels, the API and the CLI.

Byte-level BPE splits a character's UTF-8 bytes over tokens (an emoji is often four), so a
token may end mid-character. Its text must wait for the token that completes the character.
Checked on tokenizers built here, offline: bytes only (as the tiny test models), byte
fallback (SentencePiece, Llama 2) and a byte-level BPE trained to merge bytes across
character boundaries; and on the embedded SmolLM2 tokenizer.
"""
from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest
from tiny_folder import WORDS, _make_tokenizer

from specviz import models
from specviz.detok import Detokenizer, settled_text
from specviz.labels import Labeler
from specviz.events import StepEvent, TokenEvent
from specviz.render import Trace, panel_html, step_html

# The prompt: a skin-tone emoji, a flag (two regional indicators), Arabic, Hebrew, CJK.
TEXT = "Repeat exactly: 👋🏽 hello 🇫🇷 — مرحبا بالعالم — שלום עולם — 你好"
BAD = "\ufffd"


def _merging_tokenizer():
    """Byte-level BPE with a few merges, some across character boundaries ('ر\\xd8' and the like)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256 + 40, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|im_end|>"], show_progress=False)
    tok.train_from_iterator([TEXT] * 3 + ["👋🏽👋🏽 🇫🇷🇫🇷 你好你好 שלום"], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module", params=["bytes", "byte fallback", "merged bytes"])
def tokenizer(request):
    if request.param == "merged bytes":
        return _merging_tokenizer()
    return _make_tokenizer(list(WORDS), "bytelevel" if request.param == "bytes" else "metaspace")


def _decoder(tok):
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _labeler(tok, prompt=()):
    return Labeler(models, SimpleNamespace(tokenizer=tok), list(prompt))


def test_every_prefix_shows_whole_characters_only(tokenizer):
    decode = _decoder(tokenizer)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert any(decode([t]).endswith(BAD) for t in ids)  # this tokenizer does split characters
    d, shown, text = Detokenizer(decode), [""], decode(ids)
    for n, t in enumerate(ids, start=1):
        piece = d.push(t)
        shown.append(shown[-1] + piece)
        assert BAD not in piece
        # Everything complete is out (byte fallback may turn a whole run of byte tokens into
        # U+FFFD until its last character completes: then more than the prefix decodes to).
        assert text.startswith(shown[n]) and shown[n].startswith(decode(ids[:n]).rstrip(BAD))
    assert shown[-1] == text
    assert [settled_text(decode, ids[:n]) for n in range(len(ids) + 1)] == shown


def _steps(ids, seed):
    """A greedy run that emits `ids` in random chunks, some steps rejecting a draft first."""
    rng, events, i, n = random.Random(seed), [], 0, 0
    while i < len(ids):
        take = min(rng.randint(1, 4), len(ids) - i)
        kept, token = ids[i:i + take - 1], ids[i + take - 1]
        rejected = [ids[(i + 7) % len(ids)]] if rng.random() < 0.5 else []
        draft = tuple(kept) + tuple(rejected)
        events.append(StepEvent(
            step=n, position=i, draft=draft, q=None, p=(0.5,) * len(draft), accept_prob=(1.0,) * len(draft),
            draws=None, accepted=len(kept), token=token, token_p=0.9,
            token_kind="corrected" if rejected else "bonus", emitted=tuple(kept) + (token,),
            top=((token, 0.9), (ids[0], 0.1)), draft_time=0.0, verify_time=0.01, elapsed=0.01 * (n + 1),
            greedy=True))
        i, n = i + take, n + 1
    return events


@pytest.mark.parametrize("seed", range(4))
def test_a_run_labelled_event_by_event_reads_as_the_decoded_text(tokenizer, seed):
    """The panels, the API's text and the inspector: no U+FFFD where the tokenizer has none."""
    decode = _decoder(tokenizer)
    prompt = tokenizer("Say:", add_special_tokens=False)["input_ids"]
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    spec, base = Trace("spec"), Trace("baseline", speculative=False)
    labeler, base_labeler = _labeler(tokenizer, prompt), _labeler(tokenizer, prompt)
    for e in _steps(ids, seed):
        spec.add(e, labeler.label(e))
    for i, t in enumerate(ids):
        e = TokenEvent(step=i, token=t, p=0.5, time=0.01, elapsed=0.01 * (i + 1))
        base.add(e, base_labeler.label(e))
    expected = decode(prompt + ids)[len(decode(prompt)):]
    assert spec.text() == base.text() == expected
    assert BAD not in panel_html(base, "b")
    for e, labels in zip(spec.events, spec.labels):
        kept = labels.draft[: e.accepted] + (labels.token,)
        assert BAD not in "".join(kept)  # (a rejected draft may be bytes that fit nothing: that shows)


def test_a_run_cut_mid_character_keeps_that_character_back(tokenizer):
    decode = _decoder(tokenizer)
    ids = tokenizer("hi 👋", add_special_tokens=False)["input_ids"]
    labeler, trace = _labeler(tokenizer), Trace("baseline", speculative=False)
    for i, t in enumerate(ids[:-1]):
        e = TokenEvent(step=i, token=t, p=0.5, time=0.01, elapsed=0.01)
        trace.add(e, labeler.label(e))
    assert trace.text() == "hi "


def test_the_token_that_completes_a_character_shows_it_and_its_drafts_show_nothing(tokenizer):
    ids = tokenizer("👋", add_special_tokens=False)["input_ids"]
    if len(ids) < 2:
        pytest.skip("this tokenizer keeps the emoji whole")
    e = StepEvent(step=0, position=0, draft=tuple(ids[:-1]), q=None, p=(0.5,) * (len(ids) - 1),
                  accept_prob=(1.0,) * (len(ids) - 1), draws=None, accepted=len(ids) - 1, token=ids[-1],
                  token_p=0.9, token_kind="bonus", emitted=tuple(ids), top=((ids[-1], 0.9),), draft_time=0.0,
                  verify_time=0.0, elapsed=0.1, greedy=True)
    labels = _labeler(tokenizer).label(e)
    assert labels.token == "👋" and all(d == "" for d in labels.draft)
    t = Trace("spec")
    t.add(e, labels)
    assert "👋" in step_html(t, 0) and t.text() == "👋"


@pytest.mark.embedded
def test_the_embedded_tokenizer_never_shows_half_a_character():
    from specviz import models

    smol = models.load("default")
    decode = lambda ids: models.decode(smol, ids)  # noqa: E731
    ids = models.encode_prompt(smol, TEXT, chat=False)
    d, shown = Detokenizer(decode), ""
    for n, t in enumerate(ids, start=1):
        shown += d.push(t)
        assert shown == decode(ids[:n]).rstrip(BAD)
    assert shown == TEXT
    trace, labeler = Trace("spec"), Labeler(models, smol, [])
    for e in _steps(ids, 0):
        trace.add(e, labeler.label(e))
    assert trace.text() == TEXT


def test_a_candidate_that_is_part_of_a_character_shows_its_bytes(tokenizer):
    """Top-k lists and the distribution view label each candidate on its own: a piece of a
    character shows the bytes it holds (\\xNN), never U+FFFD, and whole tokens are unchanged."""
    decode = _decoder(tokenizer)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    labeler = _labeler(tokenizer)
    pieces = [t for t in ids if BAD in decode([t])]
    assert pieces  # this tokenizer does split characters
    for t in pieces:
        shown = labeler._text(t)
        assert BAD not in shown and "\\x" in shown
        parts = re.split(r"\\x([0-9a-f]{2})", shown)  # text, hex byte, text, ...
        data = b"".join(bytes([int(p, 16)]) if i % 2 else p.encode() for i, p in enumerate(parts))
        assert data.decode("utf-8", "replace") == decode([t])  # the very bytes the decoder saw
    whole = [t for t in ids if BAD not in decode([t])]
    assert whole and all(labeler._text(t) == decode([t]) for t in whole)
