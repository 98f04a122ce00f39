"""The server options of generate and bench refuse what they cannot honour, in one sentence,
before anything is sent (the tests against a real server are in test_vllm_server.py)."""
from __future__ import annotations

import pytest

from specviz.cli.main import main
from vllm_servers import free_port


@pytest.mark.parametrize("argv, says", [
    (["generate", "--server", "127.0.0.1:8000", "--prompt", "hi"], "--server must be an http:// or https://"),
    (["generate", "--server", "http://127.0.0.1:8000", "--baseline-server", "ftp://h", "--prompt", "hi"],
     "--baseline-server must be an http:// or https://"),
    (["bench", "--server", "http://127.0.0.1:8000", "--baseline-server", "127.0.0.1:8001"],
     "--baseline-server must be an http:// or https://"),
    (["generate", "--server", "http://127.0.0.1:8000", "--drafter", "eagle", "--prompt", "hi"],
     "--drafter applies to local runs"),
    (["generate", "--server", "http://127.0.0.1:8000", "--dynamic-k", "--trace", "t.json", "--prompt", "hi"],
     "--trace, --dynamic-k apply to local runs"),
    (["generate", "--baseline-server", "http://127.0.0.1:8001", "--prompt", "hi"], "go with --server"),
    (["generate", "--server", "http://127.0.0.1:8000", "--max-new-tokens", "0", "--prompt", "hi"],
     "max new tokens must be at least 1, got 0"),  # a local run's sentence (run/settings.py)
    (["generate", "--server", "http://127.0.0.1:8000", "--temperature", "3", "--prompt", "hi"],
     "temperature must be from 0 to 2, got 3"),
    (["bench", "--server", "http://127.0.0.1:8000"], "--server needs --baseline-server"),
    (["bench", "--baseline-server", "http://127.0.0.1:8001"], "go with --server"),
])
def test_refusals_are_one_sentence_and_exit_2(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and "Traceback" not in err


def test_a_server_that_is_not_there_is_named(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["generate", "--server", url, "--prompt", "hi"]) == 2
    assert f"the server at {url} did not answer" in capsys.readouterr().err
