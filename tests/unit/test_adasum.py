"""Adasum's arithmetic and the order it combines ranks in (hvdlite.core.transport.adasum_math), and the ranges the
ranks' recursive halving hands around (hvdlite.core.transport.adasum). Real ranks: tests/multirank/test_adasum.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hvdlite.core.transport import adasum_math as adasum
from hvdlite.core.transport.adasum import AdasumExchange


def test_parallel_vectors_are_averaged_and_orthogonal_ones_added() -> None:
    a = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(adasum.combine(a, 3 * a), 2 * a)  # (1 - 3/2) a + (1 - 1/6) 3a = 2a
    np.testing.assert_allclose(adasum.combine(a, a), a)
    e1, e2 = np.array([1.0, 0.0]), np.array([0.0, 5.0])
    np.testing.assert_array_equal(adasum.combine(e1, e2), e1 + e2)


def tiny_vectors(dtype, count: int, ranks: int, parallel: bool) -> list[np.ndarray]:
    """Every rank's vector of magnitudes near ``dtype``'s smallest normal number, as the host path holds
    it (16-bit widened to float32): parallel ones are power-of-two multiples of one draw (exact in any
    dtype), orthogonal ones the draw's disjoint parts."""
    draw = np.random.default_rng(3).normal(0.0, float(ml_dtypes.finfo(dtype).tiny), count).astype(dtype)
    wide = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    if parallel:
        return [(draw.astype(wide) * wide(2.0 ** rank)) for rank in range(ranks)]
    return [np.where(np.arange(count) % ranks == rank, draw, 0).astype(wide) for rank in range(ranks)]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
@pytest.mark.parametrize("count", [1024, 3 * adasum.DOT_CHUNK + 5])  # widened whole, and BLAS chunks
def test_tiny_parallel_vectors_are_averaged_and_tiny_orthogonal_ones_added(dtype, count: int) -> None:
    # Their squared norms are far below float32's range: summed in float32, or taken as zero below a
    # fixed threshold (Horovod's 1e-8), parallel vectors would be added instead of averaged.
    parallel = tiny_vectors(dtype, count, 4, parallel=True)
    want = np.mean([v.astype(np.float64) for v in parallel], axis=0)
    # Each element is rounded to float32 once or twice by the combination, subnormal ones absolutely.
    step = float(np.finfo(parallel[0].dtype).smallest_subnormal)
    np.testing.assert_allclose(adasum.reference(parallel), want, rtol=1e-6, atol=4 * step)
    orthogonal = tiny_vectors(dtype, count, 4, parallel=False)
    np.testing.assert_array_equal(adasum.reference(orthogonal), np.sum(orthogonal, axis=0))


def test_the_formula_on_random_vectors_and_a_zero_vector_is_neutral() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(50), rng.standard_normal(50)
    dot = a @ b
    want = (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b
    np.testing.assert_allclose(adasum.combine(a, b), want, rtol=1e-12)
    np.testing.assert_array_equal(adasum.combine(np.zeros(50), b), b)
    np.testing.assert_array_equal(adasum.combine(a, np.zeros(50)), a)


def test_combining_into_either_input_gives_the_same_result() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    want = adasum.combine(a, b)
    sums = adasum.partial_sums(a, b)
    into_b = b.copy()
    adasum.combine_into(a, into_b, sums, into_b)
    into_a = a.copy()
    adasum.combine_into(into_a, b, sums, into_a)
    np.testing.assert_array_equal(into_a, want)
    np.testing.assert_array_equal(into_b, want)


@pytest.mark.parametrize("n,p", [(1, 1), (2, 2), (3, 2), (4, 4), (5, 4), (7, 4), (8, 8), (12, 8)])
def test_the_largest_power_of_two(n: int, p: int) -> None:
    assert adasum.largest_power_of_two(n) == p


def test_leftover_ranks_fold_into_rank_minus_p_and_the_leaves_combine_as_a_balanced_tree() -> None:
    rng = np.random.default_rng(2)
    g = [rng.standard_normal(6) for _ in range(6)]
    c = adasum.combine
    want = c(c(c(g[0], g[4]), c(g[1], g[5])), c(g[2], g[3]))
    np.testing.assert_array_equal(adasum.reference(g), want)
    np.testing.assert_array_equal(adasum.reference(g[:3]), c(c(g[0], g[2]), g[1]))
    np.testing.assert_array_equal(adasum.reference(g[:1]), g[0])


@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize("count", [0, 1, 3, 17, 1000])
def test_after_halving_the_ranks_own_disjoint_ranges_that_cover_the_vector(p: int, count: int) -> None:
    ranges = AdasumExchange._ranges(count, p)
    owned = sorted(held[-1] for held in ranges)
    assert owned[0][0] == 0 and owned[-1][1] == count
    assert all(left[1] == right[0] for left, right in zip(owned, owned[1:], strict=False))
    for rank in range(p):  # partners at each level hold the two halves of one range
        for level, held in enumerate(ranges[rank]):
            peer = ranges[rank ^ (1 << level)][level]
            assert held[1] == peer[0] or peer[1] == held[0] or held == peer == (held[0], held[0])
