"""specviz.modeling.threads: how many threads torch gets, so that shared cores slow decoding gently."""
from __future__ import annotations

import os

import pytest
import torch

from specviz.core.errors import SpecvizError
from specviz.modeling import threads


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


@pytest.mark.parametrize("cores, load, expected", [
    (2, 0.0, 2),    # generate and the bench on a quiet 2-core machine: both cores (15.5 vs 13.5 tokens/s)
    (2, 0.9, 1),    # a neighbour keeps one core busy: a second thread would wait on it every multiply
    (2, 3.0, 1),
    (8, 0.0, 8),
    (8, 3.0, 5),
])
def test_batch_runs_take_every_idle_core(cores, load, expected):
    assert threads.choose(cores, load, role="batch") == expected


def test_for_run_sets_torch_from_the_work_it_measures_now_and_says_why():
    before = torch.get_num_threads()
    cores = threads.usable_cores()
    try:
        line = threads.for_run("batch", environ={}, measure=lambda: 0.0)
        assert torch.get_num_threads() == cores and "other work now 0.0" in line
        line = threads.for_run("app", environ={}, measure=lambda: 0.0)
        assert torch.get_num_threads() == max(1, cores - 1)
        line = threads.for_run("batch", environ={}, measure=lambda: float(cores))  # all cores busy elsewhere
        assert torch.get_num_threads() == 1
        assert "SPECVIZ_THREADS" in threads.for_run("batch", environ={"SPECVIZ_THREADS": "1"}, measure=None)
        # An explicit OMP_NUM_THREADS is the user's own choice: left as torch read it.
        torch.set_num_threads(2)
        assert "OMP_NUM_THREADS" in threads.for_run("batch", environ={"OMP_NUM_THREADS": "2"})
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_without_a_sample_the_load_average_stands_in():
    before = torch.get_num_threads()
    try:
        assert "load average" in threads.for_run("app", environ={}, measure=lambda: None)
    finally:
        torch.set_num_threads(before)


def test_other_work_leaves_our_own_process_out():
    """Busy time is the machine's less our own: our last run is not someone else's work."""
    cpus = os.cpu_count() or 1
    window = 100 * cpus  # ticks of all cores over the window
    # (machine busy, machine total, ours): we kept one core busy, nobody else did anything.
    readings = iter([(1000, 5000, 300), (1000 + 100, 5000 + window, 300 + 100)])
    assert threads.other_work(sleep=lambda s: None, ticks=lambda: next(readings)) == 0.0
    # Another process kept one core busy beside ours.
    readings = iter([(1000, 5000, 300), (1000 + 200, 5000 + window, 300 + 100)])
    assert threads.other_work(sleep=lambda s: None, ticks=lambda: next(readings)) == pytest.approx(1.0)
    assert threads.other_work(sleep=lambda s: None, ticks=lambda: None) is None  # no /proc


def test_the_machine_is_read_from_proc_where_there_is_one():
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc on this platform")
    busy, total, own = threads._cpu_ticks()
    assert 0 <= busy <= total and own >= 0
    assert 0.0 <= threads.other_work(window=0.05) <= os.cpu_count()


def test_the_thread_count_is_set_in_the_calling_thread():
    """torch fixes a thread's count at its first computation; a call from that thread still changes it."""
    import threading

    seen = {}

    def worker():
        torch.ones(4) @ torch.ones(4)  # the thread's count is fixed here
        threads.for_run("batch", environ={"SPECVIZ_THREADS": "1"})
        seen["n"] = torch.get_num_threads()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["n"] == 1


def test_the_bench_and_the_load_sweep_describe_the_machine_alike():
    from specviz.serving import load_report

    shared = {"python", "platform", "processor", "cpus", "load_average_before", "load_average_after"}
    assert set(threads.machine(1.5)) == shared and threads.machine(1.5)["load_average_before"] == 1.5
    assert set(threads.environment("cpu", torch.float32)) == shared | {"cpu", "torch", "transformers", "threads",
                                                                      "device", "dtype"}
    assert load_report.machine is threads.machine  # the load sweep writes exactly the shared keys
