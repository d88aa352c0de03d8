"""Names of a process group's unnamed calls (naming.CallNames): repeated for the response cache,
never in flight twice, and diverged sequences failed at once, late ranks included (in process)."""

import threading

from hvdlite.core.pipeline.coordinator import Coordinator
from hvdlite.core.work.naming import CallNames, call_kind, diverged_call_names
from hvdlite.core.work.request import Handle, RequestMeta
from hvdlite.core.work.response import RankMessage
from hvdlite.ops import Collective


def test_names_repeat_per_window_of_calls_of_every_kind_and_carry_the_signature() -> None:
    names = CallNames()
    taken = [names.take("allreduce", "float32[3]") for _ in range(CallNames.WINDOW + 1)]
    assert taken[0] == "call.allreduce.0.float32[3]" and taken[-1] == taken[0]
    assert len(set(taken)) == CallNames.WINDOW
    assert names.take("allgather", "int64[2]") == "call.allgather.1.int64[2]"  # one count for every kind
    assert call_kind(taken[1]) == "allreduce" and call_kind("allreduce.noname.3") is None
    kept = CallNames.names_of("allreduce", "float32[3]")  # a per-call path keeps a call's names: the same sequence
    assert [names.take_of(kept) for _ in range(2)] == ["call.allreduce.2.float32[3]", "call.allreduce.3.float32[3]"]


def test_a_name_is_reused_only_once_its_last_call_finished() -> None:
    names = CallNames()
    first = names.take("broadcast", "float32[1]r0")
    pending = Handle(first)
    names.used(first, [pending])
    for _ in range(CallNames.WINDOW - 1):
        names.take("broadcast", "float32[1]r0")
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(names.take("broadcast", "float32[1]r0")))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got  # blocked on the call that last used the name
    pending.set_result(None)
    waiter.join()
    assert got == [first]


def test_two_ranks_waiting_on_calls_the_other_lacks_diverged() -> None:
    a, b = "call.allreduce.2.float32[4]SUM1.0", "call.allreduce.2.float32[3]SUM1.0"
    ((failed, message),) = diverged_call_names({a: [0], b: [1, 2]})
    assert failed == sorted([a, b])
    assert ("rank 0: ['allreduce float32[4]SUM1.0'], rank 1: ['allreduce float32[3]SUM1.0'], "
            "rank 2: ['allreduce float32[3]SUM1.0']") in message


def test_ranks_waiting_on_calls_of_different_kinds_diverged() -> None:
    reduce, broadcast = "call.allreduce.0.float32[3]SUM1.0", "call.broadcast.0.float32[3]r0"
    ((failed, message),) = diverged_call_names({reduce: [0], broadcast: [1]})
    assert failed == sorted([reduce, broadcast])
    assert "rank 0: ['allreduce float32[3]SUM1.0'], rank 1: ['broadcast float32[3]r0']" in message
    # in one sequence, a rank ahead waits on more calls of other kinds: no divergence
    assert diverged_call_names({reduce: [0, 1], broadcast: [0]}) == []


def test_a_slower_rank_is_no_divergence() -> None:
    ahead = ["call.allreduce.0.float32[3]SUM1.0", "call.allreduce.1.float32[3]SUM1.0"]
    assert diverged_call_names({ahead[0]: [0, 1], ahead[1]: [0]}) == []  # rank 2 has not called yet
    assert diverged_call_names({"call.allreduce.0.x": [0], "allreduce.noname.1": [1]}) == []


def _message(rank: int, *names: str) -> RankMessage:
    metas = tuple(RequestMeta(name, Collective.ALLREDUCE, "float32", (3,)) for name in names)
    return RankMessage(rank, metas, tuple(0.0 for _ in metas))


def test_coordinator_fails_diverged_calls_and_the_late_rank_s_next_call_only() -> None:
    c = Coordinator(3, None, None)
    x, y = "call.allreduce.0.float32[4]SUM1.0", "call.allreduce.0.float32[3]SUM1.0"
    errors = c.round([_message(0, x), _message(1, y), _message(2)]).responses
    assert sorted(r.meta.name for r in errors) == [y, x] and {r.error_type for r in errors} == {"TensorMismatchError"}
    late = "call.allreduce.0.float32[5]SUM1.0"  # rank 2's call at that point, whatever its shape
    (error,) = c.round([_message(0), _message(1), _message(2, late)]).responses
    assert error.meta.name == late and "rank 0: ['allreduce float32[4]SUM1.0']" in error.error
    nxt = "call.allreduce.1.float32[3]SUM1.0"  # after that, the ranks' calls work again
    (ok,) = c.round([_message(0, nxt), _message(1, nxt), _message(2, nxt)]).responses
    assert ok.meta.name == nxt and not ok.error


def test_a_late_rank_gets_a_cross_kind_divergence_on_its_next_call_of_any_kind() -> None:
    c = Coordinator(3, None, None)
    x, y = "call.allreduce.0.float32[3]SUM1.0", "call.broadcast.0.float32[3]r0"
    errors = c.round([_message(0, x), _message(1, y), _message(2)]).responses
    assert sorted(r.meta.name for r in errors) == [x, y]
    late = "call.alltoall.0.float32[3]"
    (error,) = c.round([_message(0), _message(1), _message(2, late)]).responses
    assert error.meta.name == late and "rank 1: ['broadcast float32[3]r0']" in error.error
    nxt = "call.allreduce.1.float32[3]SUM1.0"  # once told, rank 2's calls are its own again
    (ok,) = c.round([_message(0, nxt), _message(1, nxt), _message(2, nxt)]).responses
    assert ok.meta.name == nxt and not ok.error
