"""run/race.Race: the baseline and each arm on one prompt, in turn, every event named and labelled."""
from __future__ import annotations

from tiny_folder import make_tiny_model_dir

from specviz.core.events import RunEnd, StepEvent
from specviz.engine.generate import GenerationConfig
from specviz.modeling import models
from specviz.run.arms import parse_arm
from specviz.run.prepare import run_here
from specviz.run.race import Race, baseline


def test_a_race_names_its_events_takes_turns_by_fewest_tokens_and_greedy_arms_match_the_baseline(tmp_path):
    target = models.load(str(make_tiny_model_dir(tmp_path / "target", seed=0)))
    ids = models.encode_prompt(target, "the cat sat on the mat, the cat sat", chat=False)
    cfg = GenerationConfig(max_new_tokens=12, k=3)
    race = Race(models, target, ids, {"base": baseline(cfg), "pld": parse_arm("pld", cfg),
                                      "bad": parse_arm("no/such-model", cfg)})
    run_here(race.prepare())
    assert set(race.failed) == {"bad"} and set(race.drafters) == {"base", "pld"}
    run_here(race.warm(cfg))
    made = {"base": 0, "pld": 0}
    for turn in race.run():
        assert turn.name in made
        if not isinstance(turn.event, RunEnd):
            ahead = {name: n for name, n in made.items() if not race.traces[name].done}
            assert made[turn.name] == min(ahead.values())  # the run with the fewest tokens went next
            assert turn.labels is not None
            made[turn.name] += len(turn.event.emitted) if isinstance(turn.event, StepEvent) else 1
    assert race.traces["pld"].token_ids == race.traces["base"].token_ids  # greedy: exactly the baseline's
    assert race.traces["pld"].speculative and not race.traces["base"].speculative
    assert race.traces["pld"].label == "prompt lookup" and race.traces["base"].done
