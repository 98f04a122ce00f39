"""Token text as a reader sees it: whole characters only, in the panels, the API and the CLI.

Byte-level BPE splits a character's UTF-8 bytes over tokens (an emoji is often four), so a
token may end mid-character. Its text must wait for the token that completes the character.
Checked on tokenizers built here, offline: bytes only (as the tiny test models), byte
fallback (SentencePiece, Llama 2) and a byte-level BPE trained to merge bytes across
character boundaries; and on the embedded SmolLM2 tokenizer.
"""
from __future__ import annotations

import copy
import random
import re
from types import SimpleNamespace

import pytest
from tiny_folder import WORDS, _make_tokenizer

from specviz.core.events import StepEvent, TokenEvent, TreeDraft
from specviz.modeling import models
from specviz.modeling.detok import BYTE_LEVEL, STUCK, Detokenizer, alone, settled_text
from specviz.render import Trace, panel_html, step_html
from specviz.render.trace import Labels
from specviz.traces.labels import Labeler

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
    from specviz.modeling import models

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


# ---- Labels against a from-scratch reference ---------------------------------------------
# The Labeler decodes a short window of settled tokens plus the new ones. Its labels must be
# exactly what decoding the whole stream from the prompt's first token at every push gives,
# on the tokenizers above and on adversarial streams: characters split over byte tokens,
# long byte-fallback runs (a Llama 2 writing rare CJK), stray and junk bytes, spaces,
# newlines, special tokens, drafts and tree branches that go nowhere.

def _fused_tokenizer():
    """Byte fallback with Llama 2's own decoder: '▁' to space, bytes, fused, one leading space off."""
    from tokenizers import decoders

    tok = _make_tokenizer(list(WORDS), "metaspace")
    tok.backend_tokenizer.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return tok


@pytest.fixture(scope="module", params=["bytes", "byte fallback", "merged bytes", "fused byte fallback"])
def any_tokenizer(request):
    if request.param == "fused byte fallback":
        return _fused_tokenizer()
    if request.param == "merged bytes":
        return _merging_tokenizer()
    return _make_tokenizer(list(WORDS), "bytelevel" if request.param == "bytes" else "metaspace")


def test_a_long_run_of_characters_in_byte_fallback_tokens_reads_right():
    """Llama 2 spells rare characters in byte tokens. A window cut inside such a run made the
    run invalid UTF-8, all U+FFFD: '你好你好你好 x' read '你好������������ x'."""
    tok = _make_tokenizer(list(WORDS), "metaspace")
    for text in ("你好你好你好 x", "a 你你你你 b", "é👋🏽你好é你好 ok"):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert "".join(models.token_strings(SimpleNamespace(tokenizer=tok), ids)) == text
        labeler = _labeler(tok, tok("Say:", add_special_tokens=False)["input_ids"])
        events = [TokenEvent(step=i, token=t, p=0.5, time=0.0, elapsed=0.0) for i, t in enumerate(ids)]
        assert "".join(labeler.label(e).token for e in events) == " " + text  # a word's space, after "Say:"


class _Whole:
    """A stream labelled the slow way: every push decodes everything from the prompt's first token.
    A token's text is what the whole decode gained past the text handed out so far, once it no
    longer ends in U+FFFD (final: at once; after STUCK such tokens: at once too)."""

    def __init__(self, decode, prompt):
        self.decode, self.ids, self.open = decode, list(prompt), 0
        self.out = len(decode(self.ids))  # characters handed out, the prompt's included

    def fork(self):
        other = copy.copy(self)
        other.ids = list(self.ids)
        return other

    def push(self, token, final=False):
        self.ids.append(int(token))
        self.open += 1
        text = self.decode(self.ids)
        settled = text if final or self.open >= STUCK else text.rstrip(BAD)
        piece = settled[self.out:]
        self.out += len(piece)
        if len(settled) == len(text):
            self.open = 0
        return piece

    def pieces(self, ids):
        return [self.push(t) for t in ids]


def _reference_labels(tok, prompt, events):
    decode = _decoder(tok)
    out = _Whole(decode, prompt)

    def row(pairs):
        return tuple(alone(tok, t, decode([t])) for t, _ in pairs)

    for e in events:
        if not isinstance(e, StepEvent):
            yield Labels(token=out.push(e.token), top=row(e.top))
            continue
        draft = tuple(out.fork().pieces(e.draft))
        at = out.fork()
        at.pieces(e.draft[: e.accepted])
        token = at.push(e.token)
        tree = []
        for i in range(len(e.tree.tokens) if e.tree else 0):
            branch, j = [], i
            while j >= 0:
                branch.insert(0, e.tree.tokens[j])
                j = e.tree.parents[j]
            node = out.fork()
            node.pieces(branch[:-1])
            tree.append(node.push(branch[-1], final=True))
        out.pieces(e.emitted)
        yield Labels(draft=draft, token=token, top=row(e.top), tree=tuple(tree),
                     **{n: tuple(map(row, getattr(e, n))) for n in ("p_top", "q_top", "p_raw", "q_raw")})


def _byte_ids(tok):
    """The token of each byte value: byte fallback's <0xNN>, or byte-level BPE's alphabet
    (SmolLM2's lacks a few bytes that UTF-8 never uses, and two lead bytes it rarely does)."""
    level = {b: ch for ch, b in BYTE_LEVEL.items()}
    ids = {}
    for b in range(256):
        for name in (f"<0x{b:02X}>", level[b]):
            i = tok.convert_tokens_to_ids(name)
            if i is not None and i != tok.unk_token_id:
                ids[b] = i
                break
    assert all(b in ids for ch in "你好é👋🏽ب\n a" for b in ch.encode()) and len(ids) > 200
    return ids


ODD = [TEXT, "你好你好你好 x", "a 你你你你 b", "  \n\n x\t y  ", "é è\n\n", "👋🏽👋🏽🇫🇷 ok", "the cat sat on the mat",
       "<|im_end|>\n<|im_start|>assistant\n", "𝔘𝔫𝔦 ", "\u200d\u00a0 ", " a  b   c"]


def _adversarial(tok, rng, length):
    """Random token ids that hit the hard cases: slices of odd text, characters spelt out in
    byte tokens, stray continuation and lead bytes, random vocabulary, special tokens."""
    byte = _byte_ids(tok)
    specials = [tok.convert_tokens_to_ids(s) for s in ("<|im_end|>", "<|im_start|>")]
    specials = [s for s in specials if s is not None and s != tok.unk_token_id]
    ids = []
    while len(ids) < length:
        kind = rng.random()
        if kind < 0.35:
            enc = tok(rng.choice(ODD), add_special_tokens=False)["input_ids"]
            a = rng.randrange(len(enc))
            ids += enc[a: a + rng.randint(1, 12)]
        elif kind < 0.55:  # whole characters, spelt in bytes (a run with byte fallback)
            ids += [byte[b] for ch in rng.choices("你好é👋🏽ب\n a", k=rng.randint(1, 6)) for b in ch.encode()]
        elif kind < 0.7:  # bytes that start or continue a character and may never finish it
            values = [rng.choice([rng.randint(0x80, 0xBF), rng.randint(0xC2, 0xF4), rng.randint(0x20, 0x7E)])
                      for _ in range(rng.randint(1, 4))]
            ids += [byte[b] for b in values if b in byte]
        elif kind < 0.85:
            ids.append(rng.randrange(len(tok)))
        elif kind < 0.95 and specials:
            ids.append(rng.choice(specials))
        elif kind < 0.98:  # an unfinished character after a word, then a word
            ids += tok(" the", add_special_tokens=False)["input_ids"] + [byte[0xE4], byte[0xBD]]
        else:  # junk bytes that never make a character: STUCK of them force their text out
            ids += tok(" the", add_special_tokens=False)["input_ids"] + [byte[0x80]] * (STUCK + 6)
    return ids[:length]


def _random_steps(ids, rng, junk):
    """Chain and tree steps that emit `ids`: random acceptances, drafts and branches that go
    nowhere (from `junk`), some rows of top-k candidates, some steps cut short (EOS), then a
    few plain tokens (they show that the output went on from exactly what was emitted)."""
    events, i, n = [], 0, 0
    while i < len(ids):
        take = min(rng.randint(1, 5), len(ids) - i)
        kept, token = tuple(ids[i:i + take - 1]), ids[i + take - 1]
        rejected = tuple(rng.choice(junk) for _ in range(rng.randint(0, 3)))
        draft = kept + rejected
        tree = None
        if rng.random() < 0.5:
            tokens, parents = list(draft), list(range(-1, len(draft) - 1))
            for _ in range(rng.randint(0, 10)):
                parents.append(rng.randrange(-1, len(tokens)))
                tokens.append(rng.choice(junk + list(ids[i:i + 6])))
            tree = TreeDraft(tuple(tokens), tuple(parents), tuple(range(len(kept))), (0.5,) * len(tokens))
        emitted = kept + (token,)
        if rng.random() < 0.1:  # the engine cuts only the last step; the Labeler does not care
            emitted = emitted[: rng.randint(1, len(emitted))]
        top = tuple((rng.choice(junk), 0.1) for _ in range(3))
        events.append(StepEvent(
            step=n, position=i, draft=draft, q=None, p=(0.5,) * len(draft), accept_prob=(1.0,) * len(draft),
            draws=None, accepted=len(kept), token=token, token_p=0.9, token_kind="bonus", emitted=emitted,
            top=top, draft_time=0.0, verify_time=0.0, elapsed=0.0, greedy=True, tree=tree,
            p_top=(top,) * (len(draft) + 1), q_top=(top,) * len(draft)))
        i, n = i + take, n + 1
    return events + [TokenEvent(step=n + k, token=t, p=0.5, time=0.0, elapsed=0.0) for k, t in enumerate(ids[:8])]


@pytest.mark.parametrize("seed", range(6))
def test_labels_equal_decoding_the_whole_stream_every_time(any_tokenizer, seed):
    tok, rng = any_tokenizer, random.Random(seed)
    decode = _decoder(tok)
    prompt = [] if seed % 3 == 0 else tok(rng.choice(ODD), add_special_tokens=False)["input_ids"]
    ids = _adversarial(tok, rng, 400)
    junk = _adversarial(tok, rng, 60)
    # The plain stream (models.token_strings, the baseline's tokens)
    base = [TokenEvent(step=i, token=t, p=0.5, time=0.0, elapsed=0.0) for i, t in enumerate(ids)]
    labeler = _labeler(tok, prompt)
    assert [labeler.label(e) for e in base] == list(_reference_labels(tok, prompt, base))
    assert settled_text(decode, ids, tok) == "".join(_Whole(decode, []).pieces(ids))
    # Speculative steps: drafts, the own token, tree nodes (an open character as U+FFFD)
    steps = _random_steps(ids, rng, junk)
    labeler = _labeler(tok, prompt)
    got = [labeler.label(e) for e in steps]
    want = list(_reference_labels(tok, prompt, steps))
    for e, g, w in zip(steps, got, want):
        assert g == w, (e, g, w)


@pytest.mark.embedded
def test_labels_equal_decoding_the_whole_stream_on_the_embedded_tokenizer():
    """SmolLM2's own tokenizer (byte-level BPE with merges across words); no model is loaded."""
    from transformers import AutoTokenizer

    from specviz.modeling.embedded import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    rng = random.Random(0)
    prompt = tok("Say it:", add_special_tokens=False)["input_ids"]
    ids, junk = _adversarial(tok, rng, 300), _adversarial(tok, rng, 40)
    steps = _random_steps(ids, rng, junk)
    labeler = _labeler(tok, prompt)
    assert [labeler.label(e) for e in steps] == list(_reference_labels(tok, prompt, steps))
