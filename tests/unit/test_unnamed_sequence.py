"""Generated names: given back by a call that failed locally, and a divergence between ranks detected."""

from hvdlite.naming import NameGenerator, diverged_generated_names
from hvdlite.ops import Collective


def test_a_given_back_name_is_generated_again():
    names = NameGenerator()
    assert names.resolve(None, Collective.ALLGATHER) == "allgather.noname.1"
    names.undo(Collective.ALLGATHER)
    assert names.resolve(None, Collective.ALLGATHER) == "allgather.noname.1"
    assert names.next(Collective.ALLGATHER) == "allgather.noname.2"


def test_ranks_at_the_same_point_of_the_sequence_are_not_a_divergence():
    # rank 0 is ahead with async calls (#3 and #4) while rank 1 has sent only #3: it will catch up
    assert diverged_generated_names({"allgather.noname.3": [0, 1], "allgather.noname.4": [0]}) == []
    assert diverged_generated_names({"allreduce.noname.3": [0], "allgather.noname.5": [1], "grad": [0]}) == []


def test_ranks_waiting_at_different_points_fail_with_every_rank_named():
    (names, message), = diverged_generated_names({"allgather.noname.3": [1], "allgather.noname.4": [0],
                                                  "broadcast.noname.9.object.size": [0, 1]})
    assert names == ["allgather.noname.3", "allgather.noname.4"]
    assert ("rank 0 at allgather #4 ('allgather.noname.4'), rank 1 at allgather #3 ('allgather.noname.3')"
            in message)


def test_group_members_count_as_one_point_of_the_sequence():
    pending = {"allreduce.noname.2.0": [0, 1], "allreduce.noname.2.1": [0]}
    assert diverged_generated_names(pending) == []
