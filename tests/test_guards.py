"""The pure stop rules, one question each, and the guard values they accept."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_loops.core import guards
from pytest_loops.errors import LoopUsageError
from pytest_loops.spec import Guards

# -- budget -------------------------------------------------------------------------


def test_budget_is_used_up_at_the_budget_not_before():
    assert not guards.budget_exhausted(9.999, 10)
    assert guards.budget_exhausted(10.0, 10)
    assert guards.budget_exhausted(11.0, 10)


def test_budget_zero_is_off():
    assert not guards.budget_exhausted(1e12, 0)


@settings(max_examples=200, deadline=None, database=None)
@given(elapsed=st.floats(0, 1e9), budget=st.floats(0, 1e9))
def test_budget_rule(elapsed, budget):
    assert guards.budget_exhausted(elapsed, budget) == (budget > 0 and elapsed >= budget)


# -- the cap ------------------------------------------------------------------------


def test_cap_is_reached_on_the_last_allowed_iteration():
    assert not guards.cap_reached(2, 3)
    assert guards.cap_reached(3, 3)
    assert guards.cap_reached(1, 1)


@settings(max_examples=200, deadline=None, database=None)
@given(iteration=st.integers(1, 1000), max_iter=st.integers(1, 1000))
def test_cap_is_always_on(iteration, max_iter):
    assert guards.cap_reached(iteration, max_iter) == (iteration >= max_iter)


# -- no progress --------------------------------------------------------------------


def test_first_measurement_has_nothing_to_compare_with():
    assert guards.next_unchanged_streak(None, "h1", 0) == 0


def test_streak_grows_while_unchanged_and_resets_on_change():
    streak = 0
    hashes = ["a", "a", "a", "b", "b"]
    seen = []
    previous = None
    for h in hashes:
        streak = guards.next_unchanged_streak(previous, h, streak)
        seen.append(streak)
        previous = h
    assert seen == [0, 1, 2, 0, 1]


def test_unmeasured_state_never_counts_as_unchanged():
    assert guards.next_unchanged_streak("a", None, 5) == 0


def test_no_progress_fires_at_k():
    assert not guards.no_progress(1, 2, measurable=True)
    assert guards.no_progress(2, 2, measurable=True)


def test_no_progress_off_at_k_zero_and_without_state_paths():
    assert not guards.no_progress(100, 0, measurable=True)
    assert not guards.no_progress(100, 2, measurable=False)


@settings(max_examples=200, deadline=None, database=None)
@given(hashes=st.lists(st.sampled_from(["a", "b", None]), min_size=1, max_size=30),
       k=st.integers(0, 5))
def test_streak_counts_consecutive_equal_measurements(hashes, k):
    streak = 0
    previous = None
    for i, h in enumerate(hashes):
        streak = guards.next_unchanged_streak(previous, h, streak)
        # the streak is the run of equal, measured hashes ending here, minus one
        run = 0
        j = i
        while j > 0 and hashes[j] is not None and hashes[j] == hashes[j - 1]:
            run += 1
            j -= 1
        assert streak == run
        assert guards.no_progress(streak, k, True) == (k > 0 and run >= k)
        previous = h


# -- escalation ---------------------------------------------------------------------


def test_escalate_after_n_iterations():
    assert not guards.should_escalate(1, 2)
    assert guards.should_escalate(2, 2)


def test_escalate_zero_is_off():
    assert not guards.should_escalate(10**6, 0)


# -- the values -----------------------------------------------------------------------


def test_defaults():
    g = Guards()
    assert (g.max_iter, g.budget_seconds, g.no_progress_k, g.escalate_after) == (6, 900.0, 2, 0)


@pytest.mark.parametrize("max_iter", [0, -1, 1.5, True, "6"])
def test_max_iter_below_one_or_not_an_integer_is_a_usage_error(max_iter):
    with pytest.raises(LoopUsageError, match="max_iter"):
        Guards(max_iter=max_iter)


@pytest.mark.parametrize("field,value", [
    ("budget_seconds", -1), ("budget_seconds", math.nan), ("budget_seconds", math.inf),
    ("budget_seconds", "10"), ("no_progress_k", -1), ("no_progress_k", 1.5),
    ("escalate_after", -2), ("escalate_after", False),
])
def test_bad_guard_values_are_usage_errors(field, value):
    with pytest.raises(LoopUsageError, match=field):
        Guards(**{field: value})


def test_zero_turns_the_optional_guards_off_but_is_valid():
    g = Guards(max_iter=1, budget_seconds=0, no_progress_k=0, escalate_after=0)
    assert g.budget_seconds == 0.0 and isinstance(g.budget_seconds, float)
