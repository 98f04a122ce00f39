"""The degeneracy meter: a text that loops must not read as success however well it drafts."""
from __future__ import annotations

from specviz.core.degeneracy import Degeneracy, degeneracy, distinct_2, longest_run


def test_the_longest_run_of_one_token_and_its_token():
    assert longest_run([]) == (0, None)
    assert longest_run([5, 7, 7, 7, 2, 7, 7]) == (3, 7)
    assert longest_run([1, 1, 2, 2]) == (2, 1)  # the first on ties


def test_distinct_2_counts_adjacent_pairs_and_needs_enough_of_them():
    assert distinct_2(list(range(9))) == 1.0
    assert distinct_2([1, 2] * 10) == 2 / 19  # (1, 2) and (2, 1), over and over
    assert distinct_2([1, 2, 3]) is None


def test_and_and_and_is_degenerate_and_warns_only_with_high_acceptance():
    looping = degeneracy([3, 9, 9, 9, 9, 9, 4, 5, 6, 7, 8])  # "x and and and and and y..."
    assert looping.degenerate and looping.longest_run == 5 and looping.run_token == 9
    assert looping.warns(0.9) and not looping.warns(0.3) and not looping.warns(None)
    a_loop = degeneracy([1, 2, 3, 4] * 8)  # "a lone soul, a lone soul": no run, few distinct pairs
    assert a_loop.longest_run == 1 and a_loop.degenerate
    fine = degeneracy(list(range(40)))
    assert not fine.degenerate and not fine.warns(1.0)
    assert Degeneracy(3, 1, 1, None).degenerate is False  # too short to judge
