"""The rule by which only one side of a split elastic job goes on (``hvdlite.elastic.reform.check_quorum``)."""

import itertools

import pytest

from hvdlite.elastic.reform import check_quorum
from hvdlite.errors import HvdliteError


@pytest.mark.parametrize(("survivors", "not_exited"), [
    ([0, 1], [0, 1, 2]),  # more than half
    ([0], [0, 1]),  # half, with the lowest rank not known to have exited
    ([1], [1]),  # rank 0 raised and exited: the one other rank of two goes on
    ([1, 2], [1, 2, 3, 4]),  # rank 0 exited; half of the rest, with its lowest
])
def test_a_side_with_the_quorum_goes_on(survivors, not_exited):
    check_quorum(survivors, not_exited, survivors[0], [])


@pytest.mark.parametrize(("survivors", "not_exited"), [
    ([1], [0, 1]),  # half, without rank 0, which may be alive on the other side of a cut link
    ([2], [0, 1, 2]),
    ([3, 4], [1, 2, 3, 4]),  # half of the ranks not known to have exited, without the lowest
])
def test_the_other_side_of_a_split_ends_naming_what_it_can_reach(survivors, not_exited):
    with pytest.raises(HvdliteError, match=rf"can reach only rank\(s\) \[{survivors[0]}"):
        check_quorum(survivors, not_exited, survivors[0], ["7"])


def test_two_sides_never_both_go_on():
    """Every split of five ranks into two live sides and the dead, whichever of the dead each side
    knows to have exited (a live rank is never known to have exited)."""
    for places in itertools.product("abd", repeat=5):
        sides = [[rank for rank, place in enumerate(places) if place == side] for side in "ab"]
        dead = [rank for rank, place in enumerate(places) if place == "d"]
        if not all(sides):
            continue
        for known_a, known_b in itertools.product(subsets(dead), repeat=2):
            winners = sum(goes_on(side, [rank for rank in range(5) if rank not in known])
                          for side, known in zip(sides, (known_a, known_b), strict=True))
            assert winners <= 1, (sides, known_a, known_b)


def subsets(items):
    return [set(chosen) for count in range(len(items) + 1) for chosen in itertools.combinations(items, count)]


def goes_on(side, not_exited):
    try:
        check_quorum(side, not_exited, side[0], [])
    except HvdliteError:
        return False
    return True
