"""Local SGD's schedule, shared by torch, Keras and JAX: which updates communicate and when averages come."""

import numpy as np
import pytest

from hvdlite.training.local_sgd import LocalSGDSchedule


def test_warmup_updates_are_synchronous_and_averages_follow_every_period_th_local_update():
    schedule = LocalSGDSchedule(period=3, warmup_steps=2)
    assert [bool(schedule.synchronous(step)) for step in range(6)] == [True, True, False, False, False, False]
    averaged = [step for step in range(12) if schedule.averages_after(step)]
    assert averaged == [4, 7, 10]  # the 3rd, 6th and 9th local updates


def test_without_warmup_the_first_average_comes_after_period_updates():
    schedule = LocalSGDSchedule(period=1)
    assert all(schedule.averages_after(step) for step in range(5))
    assert [s for s in range(20) if LocalSGDSchedule(8).averages_after(s)] == [7, 15]


def test_array_steps_give_the_same_answers_as_python_ints():
    schedule = LocalSGDSchedule(period=4, warmup_steps=3)
    steps = np.arange(20)
    assert schedule.averages_after(steps).tolist() == [bool(schedule.averages_after(int(s))) for s in steps]
    assert schedule.synchronous(steps).tolist() == [s < 3 for s in range(20)]


@pytest.mark.parametrize(("period", "warmup", "message"), [
    (0, 0, "local_sgd_period must be a positive integer, got 0"),
    (2.5, 0, "local_sgd_period must be a positive integer, got 2.5"),
    (2, -1, "local_sgd_warmup_steps must be an integer >= 0, got -1"),
])
def test_bad_periods_and_warmups_are_refused_naming_the_option(period, warmup, message):
    with pytest.raises(ValueError, match=message):
        LocalSGDSchedule(period, warmup)
