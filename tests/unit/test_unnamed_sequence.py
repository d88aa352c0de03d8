"""Generated names: given back by a call that failed locally, and a divergence between ranks detected;
unnamed object collectives named after the object's type, and ranks that passed different types."""

from hvdlite.core.work.naming import NameGenerator, diverged_generated_names, diverged_object_names, object_name
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


def test_unnamed_object_collectives_are_named_after_the_type_not_the_counter():
    assert object_name(Collective.BROADCAST, "dict") == "broadcast_object.noname.dict.object"
    assert diverged_generated_names({object_name(Collective.ALLGATHER, "int") + ".size": [0]}) == []


def test_ranks_waiting_on_objects_of_different_types_fail_naming_each_type():
    dict_size = object_name(Collective.BROADCAST, "dict") + ".size"
    none_size = object_name(Collective.BROADCAST, "NoneType") + ".size"
    (names, message), = diverged_object_names({dict_size: [0], none_size: [1, 2], "grad": [0]})
    assert names == sorted([dict_size, none_size])
    assert "broadcast_object with objects of different types: rank 0 'dict', rank 1 'NoneType', rank 2 'NoneType'" in message


def test_objects_of_one_type_or_ranks_not_yet_there_are_no_divergence():
    dict_size = object_name(Collective.ALLGATHER, "dict") + ".size"
    list_size = object_name(Collective.ALLGATHER, "list") + ".size"
    assert diverged_object_names({dict_size: [0, 1]}) == []
    assert diverged_object_names({dict_size: [0]}) == []  # rank 1 has not called yet
    assert diverged_object_names({dict_size: [0, 1], list_size: [0]}) == []  # rank 0 waits on two: threads
    assert diverged_object_names({dict_size: [0], object_name(Collective.BROADCAST, "list") + ".size": [1]}) == []
