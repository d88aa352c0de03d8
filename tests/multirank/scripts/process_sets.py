"""Process sets with real ranks, through the core (NumPy). Usage: process_sets.py CASE.

Prints 'ok CASE' when every check passed, and 'caught <Error>: <message>' for each expected error.
"""

import sys
import time

import numpy as np

import hvdlite as hvd


def sets_for(size):
    """Overlapping and disjoint sets, a one-rank set at np=3."""
    return [[0, 2], [0, 1], [1]] if size == 3 else [[0, 2], [1, 3], [0, 1, 2]]


def expect(error_type, text, fn):
    try:
        fn()
    except error_type as exc:
        assert text in str(exc), f"expected {text!r} in {exc}"
        print(f"caught {type(exc).__name__}: {exc}", flush=True)
        return
    raise AssertionError(f"expected {error_type.__name__} ({text})")


def check_set(ps, rank):
    """Every collective on ``ps``, from this member; values come from the set's members only."""
    members = ps.ranks
    me = members.index(rank)
    assert (ps.rank(), ps.size(), ps.included()) == (me, len(members), True), (ps, ps.rank())
    got = hvd.allreduce(np.array([rank + 1.0]), op=hvd.Sum, process_set=ps)  # unnamed: the set's own counter
    assert got.tolist() == [sum(r + 1.0 for r in members)], got
    for step in range(2):  # small (rides with the vector from the second call) and large (shared memory)
        for count in (3, 40_000):
            got = hvd.allreduce(np.full(count, rank + step, np.float32), name=f"avg.{count}", process_set=ps)
            assert np.allclose(got, np.mean([r + step for r in members])), (count, got[:3])
    grouped = hvd.grouped_allreduce([np.ones(2) * rank, np.ones(3)], op=hvd.Max, name="grp", process_set=ps)
    assert grouped[0].tolist() == [max(members)] * 2 and grouped[1].tolist() == [1.0] * 3
    gathered = hvd.allgather(np.full((rank + 1, 2), rank), name="gather", process_set=ps)
    assert gathered[:, 0].tolist() == [r for r in members for _ in range(r + 1)], gathered
    root = members[-1]
    assert hvd.broadcast(np.array([rank, 7]), root_rank=root, name="bcast", process_set=ps).tolist() == [root, 7]
    sent = np.arange(2 * len(members)) + 100 * rank
    received, counts = hvd.alltoall(sent, name="a2a", process_set=ps)
    assert received.tolist() == [100 * r + 2 * me + k for r in members for k in range(2)], received
    assert counts.tolist() == [2] * len(members)
    scattered = hvd.reducescatter(np.full((2 * len(members), 1), rank + 1.0), op=hvd.Sum, name="rs", process_set=ps)
    assert scattered.ravel().tolist() == [sum(r + 1.0 for r in members)] * 2, scattered
    hvd.barrier(process_set=ps)
    assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=ps) == {"from": root}
    assert hvd.allgather_object(rank, process_set=ps) == members


def static(rank, size):
    sets = [hvd.ProcessSet(ranks) for ranks in sets_for(size)]
    hvd.init(process_sets=sets)
    assert [ps.process_set_id for ps in sets] == [1, 2, 3]
    assert str(sets[0]) == f"ProcessSet(process_set_id=1, ranks={sets_for(size)[0]}, mpi_comm=None)"
    assert hvd.global_process_set.process_set_id == 0 and hvd.global_process_set.ranks == list(range(size))
    for ps in sets:
        if ps.included():
            check_set(ps, rank)
        else:
            expect(hvd.ProcessSetError, f"not part of process set {ps.process_set_id}", ps.rank)
            expect(hvd.ProcessSetError, f"rank {rank} is not in process set {ps.process_set_id}",
                   lambda ps=ps: hvd.allreduce(np.ones(1), name="outside", process_set=ps))
    assert hvd.allreduce(np.array([1.0]), op=hvd.Sum).tolist() == [size]  # the global set is untouched
    hvd.shutdown()
    assert all(ps.process_set_id is None for ps in sets)


def dynamic(rank, size):
    hvd.init(process_sets="dynamic")
    first = hvd.add_process_set([0, size - 1])
    second = hvd.add_process_set(hvd.ProcessSet(range(1, size)))
    assert (first.process_set_id, second.process_set_id) == (1, 2)
    for ps in (first, second):
        if ps.included():
            check_set(ps, rank)
    assert hvd.remove_process_set(first)
    assert first.process_set_id is None and first.size() is None
    expect(hvd.ProcessSetError, "is not registered", lambda: hvd.allreduce(np.ones(1), process_set=first))
    assert hvd.remove_process_set(first) is False  # as Horovod: nothing to remove
    again = hvd.add_process_set([0, size - 1])  # the same ranks can be registered again; the freed id is reused
    assert again.process_set_id == 1
    if again.included():
        check_set(again, rank)
    assert hvd.remove_process_set(hvd.global_process_set) is False
    hvd.shutdown()


def from_comm(rank, size):
    """Sets from mpi4py communicators, as in Horovod: a split registers every part, each rank's set is its own."""
    from mpi4py import MPI

    halves = MPI.COMM_WORLD.Split(rank % 2, rank)
    pair = MPI.COMM_WORLD.Split(0 if rank < 2 else MPI.UNDEFINED, rank)  # COMM_NULL outside ranks 0 and 1
    # Two sets with the same ranks, as communicators and/or rank lists (clones too), are refused at init
    # with a ValueError on every rank, and leave hvdlite uninitialized.
    for duplicates in ([hvd.ProcessSet(halves), hvd.ProcessSet(range(0, size, 2))],  # the even half twice
                       [hvd.ProcessSet(pair), hvd.ProcessSet(pair.Dup() if rank < 2 else pair)],
                       [hvd.ProcessSet([0, 1]), hvd.ProcessSet([1, 0])],
                       [hvd.ProcessSet(MPI.COMM_WORLD.Dup())]):
        expect(ValueError, "exists already", lambda duplicates=duplicates: hvd.init(process_sets=duplicates))
        assert not hvd.is_initialized()
    mine, first_two = hvd.ProcessSet(halves), hvd.ProcessSet(pair)
    hvd.init(process_sets=[mine, first_two])
    parity = [r for r in range(size) if r % 2 == rank % 2]
    assert mine.ranks == parity and mine.process_set_id == 1 + rank % 2, mine  # even part id 1, odd part id 2
    assert first_two.ranks == [0, 1] and first_two.process_set_id == 3 and first_two.included() == (rank < 2)
    assert hvd.allreduce(np.array([float(rank)]), op=hvd.Sum, process_set=mine).tolist() == [float(sum(parity))]
    if rank < 2:
        assert hvd.allgather(np.array([rank]), process_set=first_two).tolist() == [0, 1]
    hvd.shutdown()


def bad_sets(rank, size):
    """Every bad registration fails on every rank with the same message; the job goes on."""
    hvd.init(process_sets="dynamic")
    expect(hvd.ProcessSetError, f"ranks [{size}] are outside the job's 0..{size - 1}",
           lambda: hvd.add_process_set([0, size]))
    expect(hvd.ProcessSetError, "names a rank more than once", lambda: hvd.add_process_set([1, 1]))
    expect(hvd.ProcessSetError, "ranks asked for different process sets: rank 0: [0, 1], rank 1: [0, 2]",
           lambda: hvd.add_process_set([0, 1] if rank == 0 else [0, 2]))
    expect(hvd.ProcessSetError, "needs at least one rank", lambda: hvd.add_process_set([]))
    ps = hvd.add_process_set([1])  # failed registrations took no id
    assert ps.process_set_id == 1
    expect(hvd.ProcessSetError, "exists already as id 1", lambda: hvd.add_process_set([1]))
    expect(hvd.ProcessSetError, "exists already as id 0", lambda: hvd.add_process_set(range(size)))
    expect(hvd.ProcessSetError, "registered already", lambda: hvd.add_process_set(ps))
    expect(hvd.ProcessSetError, "is not registered", lambda: hvd.allreduce(np.ones(1), process_set=hvd.ProcessSet([0])))
    expect(hvd.ProcessSetError, "must be a hvd.ProcessSet", lambda: hvd.allreduce(np.ones(1), process_set=[0, 1]))
    if ps.included():
        expect(hvd.UnsupportedOperationError, "root_rank=0 is not in process set 1's ranks [1]",
               lambda: hvd.broadcast(np.ones(1), root_rank=0, process_set=ps))
    assert hvd.allreduce(np.array([1.0]), op=hvd.Sum).tolist() == [size]
    hvd.shutdown()


def not_dynamic(rank, size):
    hvd.init()
    expect(hvd.ProcessSetError, "needs hvd.init(process_sets='dynamic')", lambda: hvd.add_process_set([0, 1]))
    hvd.shutdown()


def second_init(rank, size):
    """init on a running hvdlite registers nothing: the sets it already holds pass, a new one is refused."""
    pair = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[pair])
    hvd.init(process_sets=[pair])  # already registered: nothing to do
    expect(hvd.ProcessSetError, "process set(s) [[1]] would stay unusable: call hvd.shutdown() first",
           lambda: hvd.init(process_sets=[pair, hvd.ProcessSet([1])]))
    expect(hvd.ProcessSetError, "runs without dynamic process sets", lambda: hvd.init(process_sets="dynamic"))
    split = MPI.COMM_WORLD.Split(color=0, key=rank)  # a set given as a communicator is named by its size
    expect(hvd.ProcessSetError, "process set(s) ['<mpi4py communicator of 3 processes>'] would stay unusable",
           lambda: hvd.init(process_sets=[hvd.ProcessSet(split)]))
    split.Free()
    if pair.included():  # the set registered first still works
        assert hvd.allreduce(np.array([1.0]), op=hvd.Sum, name="second", process_set=pair).tolist() == [2.0]
    hvd.shutdown()


def concurrent(rank, size):
    """Set [0, 1] keeps all-reducing while rank 2 sleeps: it never waits for a rank outside it."""
    pair = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[pair])
    hvd.barrier()
    if rank == 2:
        time.sleep(6)
    else:
        start = time.monotonic()
        for step in range(200):
            assert hvd.allreduce(np.array([float(step)]), op=hvd.Sum, name="pair", process_set=pair).tolist() == [2 * step]
        print(f"pair seconds {time.monotonic() - start:.2f}", flush=True)
    hvd.barrier()
    hvd.shutdown()


def reports(rank, size):
    """A set's stall warning, mismatch errors and timeline rows name the set and ranks of the job.

    Needs HVDLITE_STALL_CHECK_TIME_SECONDS=1 and HVDLITE_TIMELINE set by the test; rank 0 checks the file.
    """
    outer = hvd.ProcessSet([0, size - 1])
    hvd.init(process_sets=[outer])
    if outer.included():
        if rank == size - 1:
            time.sleep(5)  # well past the 1 s stall warning (3 s was too close on a loaded CI machine)
        hvd.allreduce(np.ones(2), name="ps.late", process_set=outer)
        try:
            hvd.allreduce(np.ones(rank + 1), name="ps.shape", process_set=outer)
            raise AssertionError("shapes that differ must fail")
        except hvd.TensorMismatchError as exc:
            print(f"mismatch: {exc}", flush=True)
    hvd.barrier()
    hvd.shutdown()
    if rank == 0:
        import json
        import os

        rows = {e["args"]["name"] for e in json.load(open(os.environ["HVDLITE_TIMELINE"]))
                if e.get("name") == "thread_name"}
        print(f"timeline rows: {sorted(rows)}", flush=True)


if __name__ == "__main__":
    from mpi4py import MPI

    cases = {"static": static, "dynamic": dynamic, "bad_sets": bad_sets, "not_dynamic": not_dynamic,
             "second_init": second_init, "concurrent": concurrent, "from_comm": from_comm, "reports": reports}
    for case in sys.argv[1].split(","):  # one or several, one after another
        cases[case](MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
        print(f"ok {case}", flush=True)
