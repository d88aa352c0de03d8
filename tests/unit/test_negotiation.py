"""Coordinator and response-cache logic, driven in process (no MPI)."""


from hvdlite.core.pipeline.cache import (
    FLUSH,
    HAS_NEW,
    SHUTDOWN,
    CycleState,
    Lookup,
    ResponseCache,
    band,
    decode,
    encode,
)
from hvdlite.core.pipeline.coordinator import Coordinator, find_mismatch
from hvdlite.core.work.request import RequestMeta
from hvdlite.core.work.response import RankMessage, Response
from hvdlite.core.work.scope import Scope
from hvdlite.ops import Collective, ReduceOp


def meta(name, shape=(4,), dtype="float32", collective=Collective.ALLREDUCE, **kw):
    return RequestMeta(name, collective, dtype, shape, **kw)


def msg(rank, *metas, shutdown=False):
    return RankMessage(rank, metas, tuple(0.0 for _ in metas), shutdown=shutdown)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_ready_only_when_every_rank_submitted():
    c = Coordinator(3, None, None)
    assert c.round([msg(0, meta("a")), msg(1, meta("a")), msg(2)]).responses == ()
    result = c.round([msg(0), msg(1), msg(2, meta("a"))])
    assert [r.meta.name for r in result.responses] == ["a"] and not result.responses[0].error
    assert c.pending_names == []


def test_mismatch_names_tensor_and_each_rank():
    c = Coordinator(2, None, None)
    (response,) = c.round([msg(0, meta("w", (2, 3))), msg(1, meta("w", (3, 2)))]).responses
    assert response.error_type == "TensorMismatchError"
    assert response.error == "Mismatched shape for allreduce of tensor 'w': rank 0: (2, 3), rank 1: (3, 2)"


def test_collective_kind_mismatch():
    found = find_mismatch("x", {0: meta("x"), 1: meta("x", collective=Collective.ALLGATHER)})
    assert found == "Mismatched collective for allreduce of tensor 'x': rank 0: ALLREDUCE, rank 1: ALLGATHER"


def test_allgather_may_differ_in_first_dimension_only():
    c = Coordinator(2, None, None)
    (ok,) = c.round([msg(0, meta("g", (1, 3), collective=Collective.ALLGATHER)),
                     msg(1, meta("g", (4, 3), collective=Collective.ALLGATHER))]).responses
    assert not ok.error and ok.per_rank == (1, 4)
    (bad,) = c.round([msg(0, meta("h", (1, 3), collective=Collective.ALLGATHER)),
                      msg(1, meta("h", (1, 2), collective=Collective.ALLGATHER))]).responses
    assert "rank 0: (2, (3,)), rank 1: (2, (2,))" in bad.error


def test_stall_warns_once_then_fails_naming_missing_ranks():
    clock = Clock()
    c = Coordinator(3, 10.0, 30.0, clock)
    c.round([msg(0, meta("a")), msg(1), msg(2)])
    clock.now = 11.0
    first = c.round([msg(0), msg(1), msg(2)])
    assert first.warnings == ("Stall: tensor 'a' (allreduce) waited 11.0 s: submitted by rank(s) [0], "
                              "missing on rank(s) [1, 2]",)
    clock.now = 12.0
    assert c.round([msg(0), msg(1), msg(2)]).warnings == ()
    clock.now = 31.0
    assert "missing on rank(s) [1, 2]" in c.round([msg(0), msg(1), msg(2)]).fatal


def test_reported_age_counts_for_stalls():
    c = Coordinator(2, 10.0, 30.0, Clock())
    result = c.round([RankMessage(0, (meta("old"),), (12.0,)), msg(1)])
    assert result.warnings and "waited 12.0 s" in result.warnings[0]


def test_shutdown_rank_fails_names_it_never_submitted():
    c = Coordinator(2, None, None)
    (response,) = c.round([msg(0, meta("a")), msg(1, shutdown=True)]).responses
    assert response.error_type == "HvdliteShutdownError" and "rank(s) [1] called shutdown()" in response.error


def test_join_counts_joined_rank_for_allreduce_only():
    c = Coordinator(3, None, None)
    join = RequestMeta("join", Collective.JOIN)
    (response,) = c.round([msg(0, meta("a")), msg(1, meta("a")), msg(2, join)]).responses
    assert response.joined == (2,) and not response.error
    (bad,) = c.round([msg(0, meta("g", collective=Collective.ALLGATHER)),
                      msg(1, meta("g", collective=Collective.ALLGATHER)), msg(2)]).responses
    assert bad.error_type == "UnsupportedOperationError"
    c.round([msg(0, join), msg(1), msg(2)])
    (done,) = c.round([msg(0), msg(1, join), msg(2)]).responses
    assert done.meta.collective is Collective.JOIN and done.last_joined == 1


def test_cache_hit_invalid_miss_and_lru_eviction():
    cache = ResponseCache(2)
    a, b, c = (Response(meta(n)) for n in "abc")
    cache.put(a)
    cache.put(b)
    assert cache.lookup(meta("a")) == (Lookup.HIT, 0)
    assert cache.lookup(meta("a", (5,)))[0] is Lookup.INVALID
    assert cache.lookup(meta("z")) == (Lookup.MISS, -1)
    cache.get(0)  # a is now most recently used, so b is evicted next
    cache.put(c)
    assert cache.lookup(meta("b"))[0] is Lookup.MISS and cache.lookup(meta("c")) == (Lookup.HIT, 1)


def test_an_allgather_entry_is_hit_only_by_this_ranks_own_request():
    """The response carries one rank's meta; ranks gather different row counts, so each keys the
    entry on what it submitted itself (else a rank whose rows changed hits stale sizes)."""
    cache = ResponseCache(4)
    first = meta("g", (2, 3), collective=Collective.ALLGATHER)  # rank 0 gathered 2 rows
    mine = meta("g", (1, 3), collective=Collective.ALLGATHER)  # this rank, 1
    cache.put(Response(first, per_rank=(2, 1)), mine)
    assert cache.lookup(mine) == (Lookup.HIT, 0)
    assert cache.lookup(first)[0] is Lookup.INVALID  # now 2 rows here: per_rank (2, 1) is stale
    cache.put(Response(meta("a")))  # without this rank's request: the response's own meta
    assert cache.lookup(meta("a"))[0] is Lookup.HIT


def test_errors_joins_and_barriers_are_not_cached():
    cache = ResponseCache(4)
    cache.put(Response(meta("e"), error="bad"))
    cache.put(Response(meta("j"), joined=(1,)))
    cache.put(Response(RequestMeta("barrier.noname.1", Collective.BARRIER)))
    assert len(cache) == 0


def test_bit_vector_ands_hits_and_ors_flags():
    words = 2
    r0 = CycleState(or_flags=HAS_NEW, and_flags=SHUTDOWN, invalid=frozenset({70}), hits=frozenset({1, 5, 64}))
    r1 = CycleState(or_flags=0, and_flags=SHUTDOWN, invalid=frozenset(), hits=frozenset({5, 64, 70, 100}))
    r2 = CycleState(or_flags=FLUSH, and_flags=0, invalid=frozenset({3}), hits=frozenset({5, 64, 70}))
    verdict = decode(band([encode(s, words) for s in (r0, r1, r2)]), words)
    assert verdict.or_flags == HAS_NEW | FLUSH
    assert verdict.and_flags == 0
    assert verdict.invalid == {3, 70}
    assert verdict.hits == {5, 64}  # 70 was hit everywhere but invalidated by rank 0
    assert len(encode(r0, words)) == 8 * (2 + 2 * words)


def test_all_ranks_shutdown_survives_the_and():
    s = CycleState(and_flags=SHUTDOWN)
    assert decode(band([encode(s, 1), encode(s, 1)]), 1).and_flags == SHUTDOWN


def test_ops_in_meta_signature():
    assert meta("x", op=ReduceOp.SUM).signature != meta("x", op=ReduceOp.MAX).signature


def test_stall_seen_first_past_shutdown_time_still_warns_before_failing():
    """A round delayed past both limits (a loaded machine) must not skip the warning."""
    clock = Clock()
    c = Coordinator(2, 1.0, 3.0, clock)
    c.round([msg(0, meta("a")), msg(1)])
    clock.now = 3.3
    result = c.round([msg(0), msg(1)])
    assert result.warnings == ("Stall: tensor 'a' (allreduce) waited 3.3 s: submitted by rank(s) [0], "
                               "missing on rank(s) [1]",)
    assert "tensor 'a' (allreduce) waited 3.3 s" in result.fatal


def test_a_process_sets_messages_name_the_set_and_ranks_of_the_job():
    clock = Clock()
    c = Coordinator(2, 10.0, 30.0, clock, scope=Scope(3, (1, 4)))  # set 3 is job ranks 1 and 4
    (bad,) = c.round([msg(0, meta("w", (2,))), msg(1, meta("w", (3,)))]).responses
    assert bad.error == ("Mismatched shape for allreduce of tensor 'w': rank 1: (2,), rank 4: (3,) "
                         "in process set 3 [1, 4]")
    c.round([msg(0), msg(1, meta("late"))])
    clock.now = 11.0
    assert c.round([msg(0), msg(1)]).warnings == (
        "Stall: tensor 'late' (allreduce) in process set 3 [1, 4] waited 11.0 s: submitted by rank(s) [4], "
        "missing on rank(s) [1]",)
    diverged, _ = c.round([msg(0, meta("allreduce.noname.1")), msg(1, meta("allreduce.noname.2"))]).responses
    assert "rank 1 at allreduce #1" in diverged.error and "rank 4 at allreduce #2" in diverged.error
    assert diverged.error.endswith("in process set 3 [1, 4]")


def test_a_rank_that_submits_a_diverged_generated_name_late_gets_the_same_error_not_a_stall():
    # Ranks 0 and 2 are at different points of the unnamed allgather sequence: both names fail at once,
    # before the slower rank 1 submitted its own #2. When it does, it must fail too, in the next round.
    c = Coordinator(3, None, None)
    first, second = c.round([msg(0, meta("allgather.noname.2")), msg(1), msg(2, meta("allgather.noname.1"))]).responses
    assert {first.meta.name, second.meta.name} == {"allgather.noname.1", "allgather.noname.2"}
    assert "different sequences of unnamed allgather" in first.error
    (late,) = c.round([msg(0), msg(1, meta("allgather.noname.2")), msg(2)]).responses
    assert late.meta.name == "allgather.noname.2" and late.error_type == "TensorMismatchError"
    assert "rank 0 at allgather #2" in late.error and c.pending_names == []


def test_object_names_are_not_remembered_after_their_types_diverged():
    # An unnamed object collective's name repeats (it is the object's type): a later call must not fail.
    c = Coordinator(2, None, None)
    size = "allgather_object.noname.int.object.size"
    failed = c.round([msg(0, meta(size)), msg(1, meta("allgather_object.noname.dict.object.size"))]).responses
    assert len(failed) == 2 and all(r.error for r in failed)
    (ok,) = c.round([msg(0, meta(size)), msg(1, meta(size))]).responses
    assert not ok.error
