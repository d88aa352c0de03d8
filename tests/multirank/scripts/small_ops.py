"""The small-op path (hvdlite.core.pipeline.lone) with real ranks. Usage: small_ops.py CASE.

steady  blocking, named, small allreduces of every dtype and op, on the job and on a process set of
        ranks [0, size - 1] ([1] at np=2): exact results, and most calls take the path (counted by wrapping each
        engine's entry point). Prints 'small ops ok'.
join    rank r has r + 2 steps of the same cached names; ranks out of data join, the others keep
        reducing with zeros for them (through the path until a peer joins, then the regular one).
"""

import sys

import numpy as np

import hvdlite as hvd
from hvdlite.core.runtime import current
from hvdlite.ops import Collective

DTYPES = ["float32", "float64", "int32", "int64"]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def count_taken(engine) -> list[int]:
    """[calls, taken]: calls of ``engine``'s small-op entry point, and how many it ran."""
    counts, enter = [0, 0], engine.lone_allreduce

    def counted(tensor, key):
        result = enter(tensor, key)
        counts[0] += 1
        counts[1] += result is not None
        return result

    engine.lone_allreduce = counted
    return counts


def expected(values: list[np.ndarray], op) -> np.ndarray:
    total = values[0].copy()
    for value in values[1:]:
        {hvd.Sum: np.add, hvd.Average: np.add, hvd.Min: np.minimum, hvd.Max: np.maximum,
         hvd.Product: np.multiply}[op](total, value, out=total)
    if op is hvd.Average:
        return total / len(values) if total.dtype.kind == "f" else np.trunc(total / len(values)).astype(total.dtype)
    return total


def steady(rank: int, size: int, subset: hvd.ProcessSet) -> None:
    counts = count_taken(current().engine)
    for step in range(30):
        for dtype in DTYPES:
            for op in OPS:
                values = [np.arange(1, 4, dtype=dtype) * (r + 1) + step % 3 for r in range(size)]
                got = hvd.allreduce(values[rank], op=op, name=f"metric.{dtype}.{op.name}")
                if np.dtype(dtype).kind == "f":
                    assert np.allclose(got, expected(values, op), rtol=1e-6), (dtype, op, got)
                else:
                    assert np.array_equal(got, expected(values, op)), (dtype, op, got)
                assert got.dtype == np.dtype(dtype) and got.shape == (3,)
    calls, taken = counts
    assert taken >= calls // 2, f"only {taken} of {calls} calls took the small-op path"
    if subset.included():
        set_counts = count_taken(current().communicators.of(subset, Collective.ALLREDUCE, None).engine)
        for step in range(50):
            got = hvd.allreduce(np.full(2, float(rank + step)), op=hvd.Sum, name="set.metric", process_set=subset)
            assert got.tolist() == [float(sum(r + step for r in subset.ranks))] * 2, got
        assert set_counts[1] >= set_counts[0] // 2, f"process set: {set_counts[1]} of {set_counts[0]} calls"
    print(f"small ops ok: {taken} of {calls} calls on the path", flush=True)


def join(rank: int, size: int, subset: hvd.ProcessSet) -> None:
    for step in range(rank + 2):
        active = [r for r in range(size) if step < r + 2]
        got = hvd.allreduce(np.full(3, float(rank + 1)), op=hvd.Sum, name="grad")
        assert got.tolist() == [float(sum(r + 1 for r in active))] * 3, (step, got)
        avg = hvd.allreduce(np.full(2, float(rank + 1)), op=hvd.Average, name="avg")
        assert np.allclose(avg, sum(r + 1 for r in active) / size), avg  # joined ranks count as zeros
    last = hvd.join()
    assert last == size - 1, last
    for _ in range(3):
        assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="after.join").tolist() == [size]
    print(f"join returned {last}", flush=True)


def main() -> None:
    hvd.init(process_sets="dynamic")
    subset = hvd.add_process_set([0, hvd.size() - 1] if hvd.size() > 2 else [1])  # at np=2, a set of one rank
    {"steady": steady, "join": join}[sys.argv[1]](hvd.rank(), hvd.size(), subset)
    hvd.shutdown()


if __name__ == "__main__":
    main()
