"""hvdlite.jax.sharded.transform's pure parts: flat layout, padding, blocks, the way back; the path outside the set."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hvdlite.jax import Compression
from hvdlite.jax.sharded.transform import ShardedState, flatten, plan_layout, sharded, take_block, unflatten
from hvdlite.ops import Average
from hvdlite.process_sets import global_process_set


def tree():
    return {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.arange(5.0) + 100, "s": jnp.float32(-1.0),
            "i": jnp.arange(3, dtype=jnp.int32), "h": jnp.ones((2, 2), jnp.float16)}


@pytest.mark.parametrize("size, padded", [(1, (18, 4, 3)), (2, (18, 4, 4)), (3, (18, 6, 3)), (4, (20, 4, 4)),
                                          (7, (21, 7, 7))])
def test_each_dtype_is_one_vector_padded_to_a_multiple_of_the_ranks(size, padded):
    layout = plan_layout(tree(), size)
    leaves = jax.tree.leaves(tree())  # b, h, i, s, w: float32 first, then float16, then int32
    assert [[leaves[i].dtype for i in group] for group in layout.groups] == [
        [jnp.float32] * 3, [jnp.float16], [jnp.int32]]
    assert layout.padded == padded
    vectors = flatten(tree(), layout)
    assert [v.shape[0] for v in vectors] == list(padded)
    assert [v.dtype for v in vectors] == [jnp.float32, jnp.float16, jnp.int32]
    assert vectors[0][:6].tolist() == [100, 101, 102, 103, 104, -1]  # b, then s, then w: leaf order
    assert not np.asarray(vectors[0][18:]).any()  # padding is zeros


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_blocks_cover_the_vectors_and_unflatten_restores_the_tree(size):
    layout = plan_layout(tree(), size)
    vectors = flatten(tree(), layout)
    blocks = [take_block(vectors, r, size) for r in range(size)]
    assert {b[0].shape for b in blocks} == {(layout.padded[0] // size,)}
    joined = [jnp.concatenate([b[g] for b in blocks]) for g in range(len(vectors))]
    back = unflatten(joined, layout)
    assert jax.tree.structure(back) == jax.tree.structure(tree())
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(tree()), strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)


def test_a_scalar_or_empty_tree_still_gives_every_rank_a_block():
    layout = plan_layout({"s": jnp.float32(2.0)}, 3)
    assert layout.padded == (3,) and flatten({"s": 2.0}, layout)[0].tolist() == [2.0, 0.0, 0.0]
    assert unflatten(flatten({"s": 2.0}, layout), layout)["s"].shape == ()
    empty = plan_layout({}, 3)
    assert empty.groups == () and flatten({}, empty) == () and unflatten((), empty) == {}


def test_the_layout_works_under_jit():
    layout = plan_layout(tree(), 3)
    flat = jax.jit(lambda t: take_block(flatten(t, layout), 1, 3))(tree())
    assert [b.shape[0] for b in flat] == [6, 2, 1]


def test_a_rank_outside_the_set_keeps_a_full_state_and_updates_locally():
    tx = sharded(optax.with_extra_args_support(optax.adam(0.1)), Average, (1.0, 1.0), Compression.none, "t",
                 False, global_process_set)
    params = {"w": jnp.ones((2, 3)), "s": jnp.float32(1.0)}
    state = tx.init(params)
    assert isinstance(state, ShardedState) and state.inner[0].mu["w"].shape == (2, 3)
    updates, state = tx.update(params, state, params)
    assert np.allclose(updates["w"], -0.1) and int(state.inner[0].count) == 1
