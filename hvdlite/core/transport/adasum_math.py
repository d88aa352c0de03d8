"""Adasum, Horovod's adaptive summation: the arithmetic, and the order in which ranks are combined.

Two gradients combine as ``(1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b`` (Maleki et al.,
"Scaling Distributed Training with Adaptive Summation", MLSys 2021): parallel gradients are
averaged, orthogonal ones added, at any scale: the weights depend only on ratios of dot products
and norms. A zero vector (a rank that joined) gets the coefficient 1 on the other's side, as in
Horovod, so it is neutral: ``adasum(0, b) == b``. Any other vector, however small, is weighed
(Horovod takes squared norms below 1e-8 as zero, which adds tiny parallel gradients instead of
averaging them).

**Order for any number of ranks.** With ``p`` the largest power of two not above ``n``, rank
``i + p`` (for ``i + p < n``) is first combined into rank ``i``: leaf ``i`` is ``adasum(g_i,
g_{i+p})``, or ``g_i`` alone. The ``p`` leaves are then combined as a balanced binary tree over
neighbours: ``adasum(adasum(L0, L1), adasum(L2, L3))`` and so on. At a power of two this is
Horovod's order; :func:`reference` computes it in one process. The ranks compute it with
recursive vector halving (:mod:`hvdlite.core.transport.adasum`), where each dot product and norm is a
sum of partial sums over pieces of the vectors: the result differs from :func:`reference` only by
the order of those additions (measured in the tests: relative differences of a few float32 ulps).

Dot products and norms are accumulated in float64, where the products of any two float32 (so also
float16 and bfloat16) values neither underflow nor overflow. Long float32 vectors are summed by BLAS
in float32 over chunks of 16384 elements; a chunk whose float32 sum is near float32's underflow
(below :data:`FLOAT32_TRUSTED`) or overflowed is summed again in float64, so tiny gradients are weighed
exactly. float64 vectors are summed twice, as they are and scaled by :data:`FLOAT64_SHIFT`, where the
squares of values down to float64's smallest normal number are normal; the weights are taken from
the scaled sums when the plain norms are below :data:`FLOAT64_TRUSTED` (the weights depend only on
ratios, so either triple gives them). The combination is computed in the buffer's own floating dtype (float32 for float16 and bfloat16
tensors, which the host path widens).
"""

from __future__ import annotations

import numpy as np

DOT_CHUNK = 1 << 14  # float32 elements per BLAS dot product (its float32 sum stays short)
# A chunk's float32 sum at least this large lost at most DOT_CHUNK products under float32's smallest
# normal (1.2e-38) each: under 2e-34 in all, 1e-7 of it. A smaller one is summed again in float64.
FLOAT32_TRUSTED = 1e-26
FLOAT64_SHIFT = 2.0 ** 600  # tiny float64 values (2e-308) scaled to 8e-128: their squares stay normal
FLOAT64_TRUSTED = 2.0 ** -900  # a float64 squared norm below this may have lost its smallest squares


def coefficients(dot: float, norm_a: float, norm_b: float) -> tuple[float, float]:
    """The weights of ``a`` and ``b`` in their Adasum, from ``a.b``, ``|a|^2`` and ``|b|^2`` (a zero
    vector's weight is 1: it leaves the other as it is)."""
    weight_a = 1.0 - dot / (2.0 * norm_a) if norm_a > 0.0 else 1.0
    weight_b = 1.0 - dot / (2.0 * norm_b) if norm_b > 0.0 else 1.0
    return weight_a, weight_b


def partial_sums(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[a.b, a.a, b.b]`` over these pieces of the two vectors, accumulated in float64; for float64
    vectors followed by the same of the vectors scaled by :data:`FLOAT64_SHIFT` (sums of pieces add
    up either way)."""
    sums = [_dot(a, b), _dot(a, a), _dot(b, b)]
    if a.dtype == np.float64:
        with np.errstate(all="ignore"):  # huge values overflow when scaled: those sums are not used
            up_a, up_b = a * FLOAT64_SHIFT, b * FLOAT64_SHIFT
            sums += [_dot(up_a, up_b), _dot(up_a, up_a), _dot(up_b, up_b)]
    return np.array(sums)


def weights(sums: np.ndarray) -> tuple[float, float]:
    """The weights of ``a`` and ``b`` from the whole vectors' :func:`partial_sums`: from the scaled
    float64 sums where a plain squared norm is too small to trust and its scaled one is finite."""
    plain, scaled = sums[:3], sums[3:]
    if len(scaled) and any(norm < FLOAT64_TRUSTED and 0.0 < up < np.inf
                           for norm, up in zip(plain[1:], scaled[1:], strict=True)):
        return coefficients(*scaled)
    return coefficients(*plain)


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``a.b`` summed in float64: float32 in chunks of :data:`DOT_CHUNK` (BLAS within a chunk, float64
    across them; widening whole vectors first measured 6x slower at 64 MB), small ones widened."""
    if a.dtype == np.float64 or a.size <= DOT_CHUNK:
        return _wide_dot(a, b)
    return sum(_chunk_dot(a[at:at + DOT_CHUNK], b[at:at + DOT_CHUNK]) for at in range(0, a.size, DOT_CHUNK))


def _chunk_dot(a: np.ndarray, b: np.ndarray) -> float:
    """A float32 chunk's dot product by BLAS, or in float64 where float32 may have lost it."""
    narrow = float(np.dot(a, b))
    return narrow if FLOAT32_TRUSTED <= abs(narrow) < np.inf else _wide_dot(a, b)


def _wide_dot(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)))


def combine_into(a: np.ndarray, b: np.ndarray, sums: np.ndarray, out: np.ndarray) -> None:
    """``out = weight_a * a + weight_b * b`` for the whole vectors' ``sums`` (``out`` may be ``a`` or ``b``)."""
    weight_a, weight_b = weights(sums)
    kind = out.dtype.type
    scaled_b = kind(weight_b) * b  # first: ``out`` may be ``b``
    np.multiply(a, kind(weight_a), out=out)
    out += scaled_b


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The Adasum of two whole vectors (a new array in ``a``'s dtype)."""
    out = np.empty_like(a)
    combine_into(a, b, partial_sums(a.reshape(-1), b.reshape(-1)), out)
    return out


def largest_power_of_two(n: int) -> int:
    """The largest power of two not above ``n`` (n >= 1)."""
    return 1 << (n.bit_length() - 1)


def reference(vectors: list[np.ndarray]) -> np.ndarray:
    """The Adasum of every rank's vector (index = rank) in the order the ranks use, in one process."""
    n = len(vectors)
    p = largest_power_of_two(n)
    leaves = [combine(vectors[i], vectors[i + p]) if i + p < n else vectors[i].copy() for i in range(p)]
    while len(leaves) > 1:
        leaves = [combine(leaves[j], leaves[j + 1]) for j in range(0, len(leaves), 2)]
    return leaves[0]
