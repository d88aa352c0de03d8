"""Process-set registration and lookup, in process: one rank of a fake three-rank job whose peers agree
(or disagree) with it. The collectives themselves run with real ranks in tests/multirank."""

import pytest

from hvdlite.core.communicators import Communicators
from hvdlite.errors import ProcessSetError
from hvdlite.ops import Collective
from hvdlite.process_sets import ProcessSet, global_process_set


@pytest.fixture(autouse=True)
def _unregister_the_global_set():
    yield
    global_process_set._removed()  # the registry registered the module's global set for a fake job


class FakeWorld:
    """Rank ``rank`` of ``size``; ``peers(value)`` gives what the other ranks contribute to an allgather."""

    def __init__(self, rank=1, size=3, peers=None):
        self.rank, self.size, self.peers, self.freed, self.splits = rank, size, peers, 0, []

    def Dup(self):
        return self

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def allgather(self, value):
        others = self.peers(value) if self.peers else [value] * (self.size - 1)
        return others[: self.rank] + [value] + others[self.rank :]

    def Split(self, color, key):
        self.splits.append(color)
        return FakeWorld(self.rank, self.size)

    def Free(self):
        self.freed += 1


class FakeEngine:
    def __init__(self):
        self.stopped = False

    def shutdown(self):
        self.stopped = True


def make(world=None, dynamic=True):
    engines = []

    def make_engine(comm, ranks, process_set_id):
        engines.append((FakeEngine(), ranks))
        return engines[-1][0], ()

    return Communicators(world or FakeWorld(), FakeEngine(), make_engine, dynamic), engines


def test_ranks_are_sorted_and_unregistered_sets_answer_none():
    ps = ProcessSet([2, 0])
    assert ps.ranks == [0, 2] and (ps.size(), ps.rank(), ps.included(), ps.process_set_id) == (None,) * 4
    assert str(ps) == "ProcessSet(process_set_id=None, ranks=[0, 2], mpi_comm=None)"
    with pytest.raises(ProcessSetError, match=r"must be ints, got \['1'\]"):
        ProcessSet([0, "1"])


def test_a_member_gets_an_engine_and_ids_count_up():
    sets, engines = make()
    inside, outside = ProcessSet([1, 2]), ProcessSet([0])
    sets.add(inside, dynamic=True)
    sets.add(outside, dynamic=True)
    assert (inside.process_set_id, inside.rank(), inside.size(), inside.included()) == (1, 0, 2, True)
    assert (outside.process_set_id, outside.size(), outside.included()) == (2, 1, False)
    with pytest.raises(ProcessSetError, match=r"not part of process set 2 \[0\]"):
        outside.rank()
    assert [ranks for _, ranks in engines] == [[1, 2]]  # no engine for a set this rank is not in
    assert sets.of(inside, Collective.ALLREDUCE, "x").engine is engines[0][0]
    assert sets.of(None, Collective.ALLREDUCE, "x") is sets.of(global_process_set, Collective.ALLREDUCE, "x")
    with pytest.raises(ProcessSetError, match=r"allreduce of 'x': rank 1 is not in process set 2 \[0\]"):
        sets.of(outside, Collective.ALLREDUCE, "x")
    sets.close()
    assert engines[0][0].stopped and inside.process_set_id is None


def test_removal_stops_the_engine_and_the_set_is_unknown_afterwards():
    sets, engines = make()
    ps = ProcessSet([0, 1])
    sets.add(ps, dynamic=True)
    assert sets.remove(ps) is True
    assert engines[0][0].stopped and ps.process_set_id is None
    with pytest.raises(ProcessSetError, match="is not registered"):
        sets.of(ps, Collective.BROADCAST, None)
    assert sets.remove(ps) is False and sets.remove(global_process_set) is False  # as Horovod's
    again = ProcessSet([0, 1])
    sets.add(again, dynamic=True)
    assert again.process_set_id == 1  # the freed id is reused


@pytest.mark.parametrize(("ranks", "message"), [
    ([0, 3], r"ranks \[3\] are outside the job's 0..2"),
    ([1, 1], "names a rank more than once"),
    ([], "needs at least one rank"),
    ([0, 1, 2], "exists already as id 0"),
])
def test_bad_sets_are_refused(ranks, message):
    sets, engines = make()
    with pytest.raises(ProcessSetError, match=message):
        sets.add(ProcessSet(ranks), dynamic=True)
    assert engines == [] and sets.sets == [global_process_set]


def test_sets_that_differ_across_ranks_are_refused_with_every_ranks_version():
    world = FakeWorld(peers=lambda value: [([0, 2], None)] * 2)
    sets, _ = make(world)
    with pytest.raises(ProcessSetError, match=r"rank 0: \[0, 2\], rank 1: \[0, 1\], rank 2: \[0, 2\]"):
        sets.add(ProcessSet([0, 1]), dynamic=True)


def test_adding_or_removing_needs_dynamic_mode():
    sets, _ = make(dynamic=False)
    sets.add(ProcessSet([0, 1]), dynamic=False)  # init's static sets
    with pytest.raises(ProcessSetError, match="needs hvd.init\\(process_sets='dynamic'\\)"):
        sets.add(ProcessSet([1, 2]), dynamic=True)


def test_includes_tells_members_from_outsiders_and_refuses_unregistered_sets():
    sets, _ = make()
    inside, outside = ProcessSet([1, 2]), ProcessSet([0])
    sets.add(inside, dynamic=True)
    sets.add(outside, dynamic=True)
    assert sets.includes(None, Collective.ALLREDUCE, "x")
    assert sets.includes(global_process_set, Collective.ALLREDUCE, "x")
    assert sets.includes(inside, Collective.ALLREDUCE, "x") and not sets.includes(outside, Collective.ALLREDUCE, "x")
    with pytest.raises(ProcessSetError, match="allreduce of 'x': .* is not registered"):
        sets.includes(ProcessSet([1]), Collective.ALLREDUCE, "x")
    with pytest.raises(ProcessSetError, match="must be a hvd.ProcessSet"):
        sets.includes([1, 2], Collective.ALLREDUCE, "x")
    sets.close()


def test_copies_of_a_process_set_are_the_set_itself_so_a_copied_model_keeps_working() -> None:
    import copy

    from hvdlite.process_sets import ProcessSet, global_process_set

    members = ProcessSet([0, 2])
    holder = {"set": members, "global": global_process_set}
    copied = copy.deepcopy(holder)
    assert copied["set"] is members and copied["global"] is global_process_set
    assert copy.copy(members) is members
