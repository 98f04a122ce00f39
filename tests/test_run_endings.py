"""How a run ends and how the prompt is wrapped, said alike by the command line and the app: a run the
model's context cut short says so (not only `--json`), and the app's chat box follows the model as
the CLI's default does."""
from __future__ import annotations

import json

import pytest

from specviz.cli.main import main as cli_main
from specviz.modeling import models
from specviz.ui import Policy, Settings
from specviz.ui.live import runner
from tiny_folder import make_tiny_model_dir

CONTEXT = 40  # positions the short model has: the prompt and a few tokens fill it


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    """A tiny model whose context is CONTEXT tokens, and no chat template."""
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("short") / "short")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    assert not models.load(str(folder)).is_chat
    return str(folder)


PROMPT = "the cat sat on the mat and the dog ran to the big red house"


def test_the_command_lines_summary_says_the_context_ended_the_run(short, capsys):
    assert cli_main(["generate", "--prompt", PROMPT, "--target", short, "--max-new-tokens", "200"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "context is full" in line)
    prompt_tokens, new = (int(w) for w in line.split("(")[1].split() if w.isdigit())
    assert line == f"the run ended because the model's context is full ({prompt_tokens} prompt tokens and {new} new)"
    assert prompt_tokens + new == CONTEXT
    assert cli_main(["generate", "--prompt", PROMPT, "--target", short, "--max-new-tokens", "4"]) == 0
    assert "context is full" not in capsys.readouterr().out  # the token limit came first


def test_the_page_says_the_context_ended_the_run_and_chat_follows_the_model(short):
    """chat=True is what the app's API sends unless told otherwise: a model without a chat template
    was refused ("turn chat formatting off") where the CLI turns chat off by itself."""
    s = Settings(prompt=PROMPT, target=short, max_new_tokens=200, chat=True)
    *_, frame = runner.playground(s, Policy(), models, lambda: False)
    assert frame.state == "done", frame.message
    assert frame.message.endswith(f"{runner.CONTEXT_FULL}.")
    loaded = models.load(short)
    assert len(frame.base.token_ids) + len(models.encode_prompt(loaded, PROMPT)) == CONTEXT
    *_, frame = runner.playground(Settings(prompt=PROMPT, target=short, max_new_tokens=4), Policy(), models,
                                  lambda: False)
    assert frame.state == "done" and runner.CONTEXT_FULL not in frame.message
