"""How a shared-memory reduction splits a chunk among ranks (pure arithmetic, no MPI job)."""

import pytest
from mpi4py import MPI

from hvdlite.core.transport.shm import SharedMemoryAllreduce, _part_bounds


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("size", [2, 3, 4, 7])
@pytest.mark.parametrize("count", [0, 1, 2, 5, 15, 16, 17, 1000, 524_288, 524_293])
def test_parts_cover_the_chunk_once_on_cache_lines_in_near_equal_shares(count, size, itemsize):
    bounds = _part_bounds(count, size, itemsize)
    assert len(bounds) == size + 1 and bounds[0] == 0 and bounds[-1] == count
    assert bounds == sorted(bounds)  # disjoint, in rank order, nothing left out
    per_line = 64 // itemsize
    assert all(b % per_line == 0 for b in bounds[:-1])  # every part starts on a cache line
    shares = [high - low for low, high in zip(bounds, bounds[1:], strict=False)]
    lines = -(-count // per_line)
    assert max(shares) <= (-(-lines // size)) * per_line  # no rank takes more than its share of lines


def test_a_single_process_gets_no_window():
    assert SharedMemoryAllreduce.create(MPI.COMM_SELF, 1, lambda request: request.Wait()) is None
