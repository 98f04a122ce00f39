"""Real vLLM servers for the tests marked `vllm`: started by scripts/serve-vllm.sh, or reused.

SPECVIZ_VLLM_URL / SPECVIZ_VLLM_BASELINE_URL point at servers already running (the spec one with
ngram speculation, the baseline without), SPECVIZ_VLLM_SUFFIX_URL at one with suffix speculation;
otherwise they start here on free loopback ports (~3 min on 2 cores) and stop when the tests
end. No mock stands in for them. What both server lanes share (this file's cli, and llamacpp_servers.py's
servers) lives here too: the prompt, the `urls` fixture and the checks of a `generate --json` record.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "serve-vllm.sh"
START_S = 900  # a busy 2-core machine took ~3.5 min; a cold disk more
# Repetition gives n-gram lookup something to find: its drafts are kept here.
ECHO = "Repeat this line three times, exactly: the quick brown fox jumps over the lazy dog."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server started by a serve script, ready once the script prints `banner ... at URL`."""

    def __init__(self, spec: str, script=SCRIPT, banner: str = "vLLM is serving", extra: tuple[str, ...] = ()):
        self.port, self.banner, self.name = free_port(), banner, banner.split()[0]
        self.proc = subprocess.Popen([str(script), "--spec", spec, "--port", str(self.port), *extra], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.url, self.log = None, []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.log.append(line)
            if line.startswith(self.banner) and " at http" in line:
                self.url = line.rsplit(" at ", 1)[1].strip()
                self.ready.set()
        self.ready.set()  # exited

    def wait(self, deadline: float) -> str:
        self.ready.wait(max(0.0, deadline - time.monotonic()))
        if self.url is None:
            raise RuntimeError(f"{self.name} did not start:\n" + "".join(self.log[-30:]))
        return self.url

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def servers():
    """(spec_url, baseline_url, stop): reused from the environment or started here."""
    spec, base = os.environ.get("SPECVIZ_VLLM_URL"), os.environ.get("SPECVIZ_VLLM_BASELINE_URL")
    if spec and base:
        return spec, base, lambda: None
    return start_pair(Server("ngram"), Server("off"))


def start_pair(spec: "Server", base: "Server", seconds: float = START_S):
    """(spec_url, baseline_url, stop) once both answer; both stopped if either does not."""
    started, deadline = [spec, base], time.monotonic() + seconds
    try:
        urls = [s.wait(deadline) for s in started]
    except Exception:
        for s in started:
            s.stop()
        raise
    return urls[0], urls[1], lambda: [s.stop() for s in started]


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m specviz ARGS` from the repository root, as a user would run it."""
    return subprocess.run([sys.executable, "-m", "specviz", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def audit(spec: str, base: str, path, draws: int = 200) -> tuple[subprocess.CompletedProcess, dict]:
    """`python -m specviz audit` on a server pair (the default repeated question): the process and its
    --json results (issue 56)."""
    r = cli("audit", "--server", spec, "--baseline-server", base, "--draws", str(draws), "--json", str(path))
    assert r.returncode in (0, 1), r.stderr  # 1: not exact, which the caller judges with the table in stdout
    return r, json.loads(path.read_text())


def lane(servers):
    """A lane's `urls` fixture: (spec_url, baseline_url) from `servers()`, started once for the module."""
    @pytest.fixture(scope="module")
    def urls():
        spec, base, stop = servers()
        yield spec, base
        stop()
    return urls


def generated(spec: str, base: str, engine: str, k: int) -> dict:
    """`generate --json` of ECHO on both servers, holding what any engine's record must: its per-step
    arrays add up to the run's counts, no step keeps more than it drafted or drafts more than `k`,
    and the server-wide counters moved by exactly this request's drafts (nothing else ran)."""
    r = cli("generate", "--server", spec, "--baseline-server", base, "--prompt", ECHO, "--max-new-tokens", "48",
            "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    st, sv = out["stats"], out["server"]
    assert "quick brown fox" in out["text"] and sv["engine"] == engine
    assert len(sv["per_step_accepted"]) == len(sv["per_step_drafted"]) == st["steps"] > 0
    assert sum(sv["per_step_accepted"]) == st["accepted"] > 0 and sum(sv["per_step_drafted"]) == st["drafted"]
    assert all(0 <= a <= d <= k for a, d in zip(sv["per_step_accepted"], sv["per_step_drafted"]))
    assert st["acceptance_rate"] == pytest.approx(st["accepted"] / st["drafted"])
    delta = sv["metrics_delta"]
    assert delta["draft_tokens"] == st["drafted"] and delta["accepted_tokens"] == st["accepted"]
    assert out["baseline"]["stats"]["tokens"] > 0 and "identical_to_baseline" in out
    return out


def suffix_server():
    """(url, stop) of a server with suffix speculation (arctic-inference's suffix tree)."""
    url = os.environ.get("SPECVIZ_VLLM_SUFFIX_URL")
    if url:
        return url, lambda: None
    server = Server("suffix")
    try:
        return server.wait(time.monotonic() + START_S), server.stop
    except Exception:
        server.stop()
        raise
