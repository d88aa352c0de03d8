"""The Keras/TensorFlow and JAX elastic states in process, on one rank without hvdlite.init():
the broadcasts are replaced by fakes that hand back "rank 0's" values."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
import pytest
import tensorflow as tf
from jax.experimental import io_callback

import hvdlite.jax as hvd_jax
import hvdlite.tensorflow as hvd_tf
import hvdlite.tensorflow.keras as hvd_keras
from hvdlite import objects
from hvdlite.errors import HorovodInternalError, PeerFailedError
from hvdlite.jax import elastic as jax_elastic
from hvdlite.tensorflow import elastic as tf_elastic


@pytest.fixture(autouse=True)
def one_rank(monkeypatch):
    """Object broadcasts return their argument, as on a job of one rank."""
    monkeypatch.setattr(objects, "broadcast_object", lambda obj, root_rank=0, *args, **kwargs: obj)


def make_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model


def keras_values(state):
    return [np.array(v.numpy()) for v in state.model.weights + list(state.optimizer.variables)]


def assert_equal_values(got, want):
    assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_keras_state_builds_the_optimizer_and_restores_the_commit_exactly():
    model = make_model()
    state = hvd_keras.elastic.KerasState(model, epoch=0)
    assert state.optimizer is model.optimizer and model.optimizer.built  # its slots exist before a step
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 1), np.float32)
    model.train_on_batch(x, y)
    state.epoch = 1
    state.commit()
    committed = keras_values(state)
    model.train_on_batch(x * 3, y + 1)
    state.epoch = 9
    assert not np.array_equal(keras_values(state)[0], committed[0])
    state.restore()
    assert_equal_values(keras_values(state), committed)  # weights and Adam's moments and iteration count
    assert state.epoch == 1
    model.train_on_batch(x, y)  # training goes on from the restored values
    state.restore()
    assert_equal_values(keras_values(state), committed)  # the commit is a copy, untouched by training


def test_keras_sync_takes_rank_0s_variables_and_a_restore_after_it_keeps_them(monkeypatch):
    model = make_model()
    state = hvd_tf.elastic.TensorFlowKerasState(model)
    root = [np.full_like(value, 2) for value in keras_values(state)]

    def from_root(variables, root_rank):
        assert root_rank == 0
        for variable, value in zip(variables, root, strict=True):
            variable.assign(value)
    monkeypatch.setattr(tf_elastic, "broadcast_variables", from_root)
    state.sync()
    assert_equal_values(keras_values(state), root)
    model.train_on_batch(np.ones((2, 3), np.float32), np.zeros((2, 1), np.float32))
    state.restore()
    assert_equal_values(keras_values(state), root)


def _keras_sync_broadcasts(monkeypatch, optimizer, reformed, every_rank):
    """Whether a KerasState sync broadcast the variables, given what the ranks' counts gather to."""
    model = make_model()
    model.compile(optimizer=optimizer, loss="mse")
    state = hvd_keras.elastic.KerasState(model)
    state.commit()
    gathered, broadcast = [], []
    monkeypatch.setattr(objects, "allgather_object", lambda obj, *args, **kwargs: gathered.append(obj) or every_rank)
    monkeypatch.setattr(tf_elastic, "broadcast_variables", lambda variables, root_rank: broadcast.append(root_rank))
    state.reformed = reformed
    state.sync()
    assert state.commits_since_sync == 0 and not state.reformed
    assert gathered in ([], [(reformed, 1)])
    return bool(broadcast)


def test_keras_leaves_out_the_broadcast_only_after_a_re_form_with_an_averaging_optimizer_and_equal_commits(
        monkeypatch):
    averaging = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1))
    assert not _keras_sync_broadcasts(monkeypatch, averaging, True, [(True, 1), (True, 1)])
    assert _keras_sync_broadcasts(monkeypatch, hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), True,
                                  [(True, 1), (True, 2)])  # a death in the middle of a commit
    assert _keras_sync_broadcasts(monkeypatch, hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), True,
                                  [(True, 1), (False, 0)])  # a rank that joined
    assert _keras_sync_broadcasts(monkeypatch, hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), False,
                                  [(False, 1), (False, 1)])  # a sync the script calls
    assert _keras_sync_broadcasts(monkeypatch, keras.optimizers.SGD(0.1), True, [(True, 1), (True, 1)])
    local = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), local_sgd_period=4)
    assert _keras_sync_broadcasts(monkeypatch, local, True, [(True, 1), (True, 1)])


def test_tensorflow_state_tracks_plain_variables_and_refuses_graph_sessions():
    variables = [tf.Variable([1.0, 2.0]), tf.Variable(3, dtype=tf.int64)]
    state = hvd_tf.elastic.TensorFlowState(variables, step=0)
    variables[0].assign([5.0, 6.0])
    state.step = 1
    state.commit()
    variables[0].assign_add([1.0, 1.0])
    variables[1].assign(7)
    state.restore()
    assert variables[0].numpy().tolist() == [5.0, 6.0] and int(variables[1].numpy()) == 3 and state.step == 1
    with pytest.raises(NotImplementedError, match="eager TensorFlow 2 only"):
        hvd_tf.elastic.TensorFlowState(variables, session=object())
    with pytest.raises(ValueError, match="no global variable collection"):
        hvd_tf.elastic.TensorFlowState()
    unbuilt = keras.Sequential([keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="must be built"):
        hvd_keras.elastic.KerasState(unbuilt)


def test_keras_callbacks_update_batch_and_epoch_and_commit_every_n_batches():
    model = make_model()
    state = hvd_keras.elastic.KerasState(model, batch=0, epoch=0)
    commits = []
    commit = state.commit
    state.commit = lambda: (commits.append((state.batch, state.epoch)), commit())
    callbacks = [hvd_keras.elastic.UpdateBatchStateCallback(state), hvd_keras.elastic.UpdateEpochStateCallback(state),
                 hvd_keras.elastic.CommitStateCallback(state, batches_per_commit=2)]
    x, y = np.ones((6, 3), np.float32), np.zeros((6, 1), np.float32)
    model.fit(x, y, batch_size=2, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    # 3 batches per epoch: a commit after every second batch (the count runs on across epochs, as in
    # Horovod) and one at each epoch's end, after the batch was reset and the epoch counted.
    assert commits == [(1, 0), (0, 1), (0, 1), (2, 1), (0, 2)], commits
    assert state.batch == 0 and state.epoch == 2
    committed = keras_values(state)
    state.restore()
    assert_equal_values(keras_values(state), committed)  # the epoch-end commit holds the final weights
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=callbacks)
    assert state.epoch == 3  # epochs count on from the state across fit calls
    with pytest.raises(ValueError, match="at least 1"):
        hvd_keras.elastic.CommitStateCallback(state, batches_per_commit=0)


def jax_setup():
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.zeros(3)}
    tx = optax.adam(0.1)
    return params, tx, tx.init(params)


def jax_step(tx, params, opt_state, scale):
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * scale, params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def leaves_equal(a, b):
    left, right = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(left) == len(right) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                           for x, y in zip(left, right, strict=True))


def test_jax_state_restores_pytrees_exactly_as_jax_arrays_and_keeps_plain_attributes():
    params, tx, opt_state = jax_setup()
    state = hvd_jax.elastic.JaxState(params, opt_state, step=0, ema=np.ones(2), history=[])
    assert state.params is params and state.opt_state is opt_state
    state.params, state.opt_state = jax_step(tx, state.params, state.opt_state, 1.0)
    state.step, state.history = 1, ["a"]
    state.commit()
    committed = (state.params, state.opt_state)
    state.params, state.opt_state = jax_step(tx, state.params, state.opt_state, -5.0)
    state.ema[:] = 7.0  # a NumPy attribute changed in place: the commit holds a copy
    state.step, state.history = 5, ["lost"]
    state.restore()
    assert leaves_equal((state.params, state.opt_state), committed)
    assert isinstance(state.params["w"], jax.Array) and state.params["w"].sharding == committed[0]["w"].sharding
    assert jax.tree.structure(state.opt_state) == jax.tree.structure(committed[1])
    assert state.ema.tolist() == [1.0, 1.0] and isinstance(state.ema, np.ndarray)
    assert state.step == 1 and state.history == ["a"]


def test_jax_sync_takes_rank_0s_trees_in_one_broadcast(monkeypatch):
    params, _, opt_state = jax_setup()
    state = hvd_jax.elastic.JaxState(params, opt_state)
    root = jax.tree.map(lambda leaf: leaf + 1, {"params": params, "opt_state": opt_state})
    calls = []

    def from_root(tree, root_rank, name):
        calls.append((root_rank, name, jax.tree.structure(tree)))
        return root
    monkeypatch.setattr(jax_elastic, "broadcast_parameters", from_root)
    state.sync()
    assert calls == [(0, "elastic.JaxState", jax.tree.structure(root))]
    assert leaves_equal(state.params, root["params"]) and leaves_equal(state.opt_state, root["opt_state"])
    state.params = jax.tree.map(lambda leaf: leaf * 0, state.params)
    state.restore()  # a sync is saved: restoring brings back the synced trees
    assert leaves_equal(state.params, root["params"])


def test_jax_state_refuses_typed_prng_keys_with_the_fix():
    with pytest.raises(TypeError, match="key_data"):
        hvd_jax.elastic.JaxState(params={"w": jnp.ones(2)}, rng=jax.random.key(0))
    state = hvd_jax.elastic.JaxState(rng=jax.random.key_data(jax.random.key(0)))
    assert "rng" in state._tree_names


def peer_dies(*arrays):
    raise PeerFailedError([2])


def tf_compiled_collective():
    @tf.function
    def step(x):
        return tf.numpy_function(peer_dies, [x], tf.float32, stateful=True)
    step(tf.ones(2))


def jax_compiled_collective():
    @jax.jit
    def step(x):
        return io_callback(peer_dies, jax.ShapeDtypeStruct((2,), jnp.float32), x, ordered=True)
    step(jnp.ones(2)).block_until_ready()


@pytest.mark.parametrize("run, compiled", [(hvd_tf.elastic.run, tf_compiled_collective),
                                           (hvd_jax.elastic.run, jax_compiled_collective)])
def test_run_sees_a_peer_failure_inside_a_compiled_function_and_restores(run, compiled):
    state = hvd_jax.elastic.JaxState(step=0)
    calls = []

    @run
    def train(state):
        calls.append(state.step)
        state.step = 4
        state.commit()
        state.step = 6
        compiled()

    with pytest.raises(HorovodInternalError, match="PeerFailedError") as raised:
        train(state)
    assert not isinstance(raised.value, PeerFailedError) and raised.value.__cause__ is not None
    assert calls == [0] and state.step == 4  # restored; outside elastic mode the error is raised


@pytest.mark.parametrize("run, error", [(hvd_tf.elastic.run, tf.errors.UnknownError(None, None, "ValueError: bad")),
                                        (hvd_jax.elastic.run, jax.errors.JaxRuntimeError("INTERNAL: bad"))])
def test_run_lets_other_framework_errors_through(run, error):
    @run
    def train(state):
        raise error

    with pytest.raises(type(error)):
        train(hvd_jax.elastic.JaxState(step=0))
