"""specviz.threads: how many threads torch gets, so that shared cores slow decoding gently."""
from __future__ import annotations

import pytest
import torch

from specviz import threads
from specviz.errors import SpecvizError


@pytest.mark.parametrize("cores, load, expected", [
    (2, 0.0, 1),    # a quiet 2-core machine: one core stays free for the web server, a browser, the OS
    (2, 3.5, 1),    # a busy one: still one thread, never zero
    (1, 0.0, 1),
    (8, 0.0, 7),    # one spare core
    (8, 0.9, 7),    # one busy neighbour takes the spare core
    (8, 3.0, 5),    # the cores others keep busy are left to them
    (8, 2.8, 5),    # a core 3/4 free counts as free
    (8, 20.0, 1),
    (4, -1.0, 3),   # a nonsense load reading changes nothing
])
def test_threads_leave_a_core_spare_and_the_busy_ones_alone(cores, load, expected):
    assert threads.choose(cores, load) == expected


@pytest.mark.parametrize("setting, expected", [("3", 3), (" 1 ", 1), ("16", 16), ("auto", 7), ("", 7)])
def test_specviz_threads_overrides_the_rule(setting, expected):
    assert threads.choose(8, 0.0, setting) == expected


@pytest.mark.parametrize("setting", ["0", "-2", "two", "1.5"])
def test_a_bad_specviz_threads_is_a_clear_error(setting):
    with pytest.raises(SpecvizError, match="SPECVIZ_THREADS"):
        threads.choose(2, 0.0, setting)


@pytest.mark.parametrize("cpu_max, cores", [("200000 100000\n", 2), ("150000 100000", 1), ("50000 100000", 1),
                                            ("max 100000", None), ("", None), ("garbage", None)])
def test_a_containers_cpu_quota_counts_whole_cores(cpu_max, cores):
    assert threads.quota_cores(cpu_max) == cores


def test_apply_sets_torch_and_says_how_to_change_it():
    before = torch.get_num_threads()
    try:
        line = threads.apply({"SPECVIZ_THREADS": "1"})
        assert torch.get_num_threads() == 1 and "SPECVIZ_THREADS" in line
        # An explicit OMP_NUM_THREADS is the user's own choice: left as torch read it.
        torch.set_num_threads(2)
        assert "OMP_NUM_THREADS" in threads.apply({"OMP_NUM_THREADS": "2"})
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_bench_and_the_load_sweep_describe_the_machine_alike():
    from specviz.bench import report
    from specviz.serving import load_report

    shared = {"python", "platform", "processor", "cpus", "load_average_before", "load_average_after"}
    assert set(threads.machine(1.5)) == shared and threads.machine(1.5)["load_average_before"] == 1.5
    assert set(report.environment("cpu", torch.float32)) == shared | {"torch", "transformers", "threads", "device",
                                                                      "dtype"}
    assert load_report.machine is threads.machine  # the load sweep writes exactly the shared keys
