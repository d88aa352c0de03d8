"""hvdlite.jax logic that needs no second rank: sharding, names, conversions, compression, arguments."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import hvdlite.jax as hvd
from hvdlite.jax.collectives import arrays
from hvdlite.jax.collectives import calls as collectives
from hvdlite.utils.buffers import aligned_empty


@pytest.mark.parametrize("n, size", [(10, 3), (9, 3), (2, 4), (0, 2), (7, 1)])
def test_shards_are_equal_sized_and_cover_the_data(n, size):
    shards = [hvd.shard_indices(n, 3, seed=1, rank=r, size=size) for r in range(size)]
    assert len({len(s) for s in shards}) == 1
    assert set(np.concatenate(shards).tolist()) == set(range(n))
    dropped = [hvd.shard_indices(n, 3, seed=1, drop_last=True, rank=r, size=size) for r in range(size)]
    flat = np.concatenate(dropped).tolist()
    assert len(flat) == len(set(flat)) == n // size * size


def test_shards_reshuffle_per_epoch_and_seed_but_not_per_call():
    def take(epoch, seed):
        return hvd.shard_indices(50, epoch, seed=seed, rank=1, size=2).tolist()
    assert take(0, 0) == take(0, 0) and take(0, 0) != take(1, 0) and take(0, 0) != take(0, 1)
    assert hvd.shard_indices(6, 5, shuffle=False, rank=0, size=2).tolist() == [0, 2, 4]
    with pytest.raises(ValueError, match="rank=2, size=2"):
        hvd.shard_indices(6, rank=2, size=2)


def test_aligned_core_results_become_jax_arrays_without_a_copy():
    result = aligned_empty((256,), np.float32)
    result[:] = 3.0
    adopted = arrays.to_jax(result)
    assert adopted.unsafe_buffer_pointer() == result.ctypes.data
    view = arrays.to_numpy(adopted)
    assert view.ctypes.data == result.ctypes.data  # and back to NumPy for free


def test_traced_names_are_stable_and_depend_on_what_moves():
    treedef = jax.tree.structure({"a": 0, "b": 0})
    spec = [jax.ShapeDtypeStruct((3,), np.dtype(np.float32))] * 2
    name = collectives._traced_name("allreduce", treedef, spec, ("SUM",))
    assert name == collectives._traced_name("allreduce", treedef, spec, ("SUM",))
    assert name.startswith("jit.allreduce.")
    other = [jax.ShapeDtypeStruct((4,), np.dtype(np.float32))] * 2
    assert name != collectives._traced_name("allreduce", treedef, other, ("SUM",))
    assert name != collectives._traced_name("allreduce", treedef, spec, ("MAX",))


@pytest.mark.parametrize("compressor, wire", [(hvd.Compression.fp16, jnp.float16), (hvd.Compression.bf16, jnp.bfloat16)])
def test_compression_casts_floats_only_and_restores(compressor, wire):
    x = jnp.linspace(-2, 2, 5, dtype=jnp.float32)
    sent, ctx = compressor.compress(x)
    assert sent.dtype == wire and compressor.decompress(sent, ctx).dtype == jnp.float32
    ints = jnp.arange(3)
    assert compressor.compress(ints)[0] is ints
    traced = jax.jit(lambda v: compressor.decompress(*compressor.compress(v)))(x)
    assert np.allclose(traced, x, atol=1e-2)


def test_optimizer_arguments_are_checked_before_any_collective():
    with pytest.raises(hvd.UnsupportedOperationError, match="Average or Sum"):
        hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Min)
    with pytest.raises(ValueError, match="needs op=Average"):
        hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="positive int"):
        hvd.DistributedOptimizer(optax.sgd(0.1), backward_passes_per_step=1.5)


def test_the_adapter_exports_the_core_names_and_its_own():
    for name in ("init", "rank", "Average", "StallError", "allreduce", "DistributedOptimizer", "shard_indices"):
        assert name in hvd.__all__ and hasattr(hvd, name)


def test_local_sgd_needs_params_and_checks_its_counts():
    from hvdlite.jax.slow_links.local_sgd import local_sgd
    from hvdlite.process_sets import global_process_set

    inner = optax.with_extra_args_support(optax.sgd(0.1))
    for period, warmup, message in ((0, 0, "local_sgd_period must be a positive integer, got 0"),
                                    (2, -1, "local_sgd_warmup_steps must be an integer >= 0, got -1")):
        with pytest.raises(ValueError, match=message):
            local_sgd(inner, lambda u: u, period, warmup, False, "t", False, global_process_set)
    tx = local_sgd(inner, lambda u: u, 2, 0, False, "t", False, global_process_set)
    params = {"w": jnp.ones(3)}
    state = tx.init(params)
    with pytest.raises(ValueError, match="averages parameters: pass them"):
        tx.update(params, state)
    updates, state = tx.update(params, state, params)  # outside any process set: local steps only
    assert int(state.step) == 1 and np.allclose(updates["w"], -0.1)


def test_an_elastic_sync_zeroes_int8_residuals_of_every_diloco_state_and_keeps_the_rest():
    from hvdlite.jax.elastic import _without_residuals
    from hvdlite.jax.slow_links.diloco import DiLoCoState

    def diloco_state(residual):
        return DiLoCoState(jnp.asarray(3), jnp.asarray(1), (), (), [jnp.ones(2)], [], [], [jnp.full(2, residual)])

    synced = _without_residuals({"opt": (diloco_state(0.5), optax.EmptyState()), "other": [jnp.full(2, 0.5)]})
    state = synced["opt"][0]
    assert isinstance(state, DiLoCoState) and np.array_equal(state.residuals[0], np.zeros(2))
    assert int(state.step) == 3 and np.array_equal(state.global_params[0], np.ones(2))
    assert np.array_equal(synced["other"][0], np.full(2, 0.5))  # not DiLoCo's: left as synced
    unchanged = diloco_state(0.5)._replace(residuals=[])
    assert _without_residuals(unchanged).residuals == []


def test_jax_does_not_log_hvdlite_errors_that_reach_the_caller_but_still_logs_others(caplog):
    # hvdlite's errors inside jit reach the caller in JaxRuntimeError; JAX's own log of them is dropped.
    from jax.experimental import io_callback

    from hvdlite.errors import TensorMismatchError

    def failing(error):
        def callback(x):
            raise error
        return jax.jit(lambda x: io_callback(callback, jax.ShapeDtypeStruct((2,), jnp.float32), x, ordered=True))

    for error, logged in ((TensorMismatchError("mismatched shape for allreduce of 'w'"), False),
                          (ValueError("the user's own callback"), True)):
        caplog.clear()
        with pytest.raises(Exception, match=str(error)):
            failing(error)(jnp.ones(2)).block_until_ready()
        assert any("io_callback failed" in record.getMessage() for record in caplog.records) == logged, caplog.text
