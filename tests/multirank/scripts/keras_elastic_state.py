"""hvd.elastic for Keras 3 on a fixed world: KerasState syncs, commits and restores a model and its
optimizer; the state callbacks count batches and epochs and commit inside fit. Prints
'ok keras elastic state' and 'ok keras elastic callbacks'.
"""

import keras
import numpy as np

import hvdlite.tensorflow.keras as hvd


def build(rank):
    keras.utils.set_random_seed(rank)  # every rank starts different: sync() must make them equal
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.05)), loss="mse")
    return model


def values(state):
    return [np.array(v.numpy()) for v in list(state.model.weights) + list(state.optimizer.variables)]


def same_on_every_rank(state):
    every = hvd.allgather_object([v.tolist() for v in values(state)])
    return all(e == every[0] for e in every)


def equal(got, want):
    return len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def data(rank, batches=4):
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(batches * 2, 3)).astype(np.float32)
    return x, x.sum(axis=1, keepdims=True).astype(np.float32)


def check_state(rank, size):
    model = build(rank)
    state = hvd.elastic.KerasState(model, epoch=0)
    assert not same_on_every_rank(state)
    state.sync()
    assert same_on_every_rank(state), "sync() must give every rank rank 0's weights and optimizer state"
    x, y = data(rank)
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)  # 4 steps, gradients averaged
    assert same_on_every_rank(state), "the DistributedOptimizer keeps the ranks in step"
    assert int(state.optimizer.iterations.numpy()) == 4
    state.epoch = rank + 1  # different on every rank; a sync takes rank 0's commit
    state.commit()
    committed = values(state)
    model.fit(x * 2, y, batch_size=2, epochs=1, verbose=0)
    model.layers[0].kernel.assign(np.full((3, 4), float(rank), np.float32))
    state.epoch = 99
    state.restore()
    assert equal(values(state), committed), "restore() must bring back the commit exactly"
    assert state.epoch == rank + 1
    if rank == 0:
        model.layers[1].bias.assign([42.0])
    state.sync()
    assert same_on_every_rank(state) and float(model.layers[1].bias.numpy()[0]) == 42.0
    assert state.epoch == 1, "plain attributes: every rank gets rank 0's commit"
    synced = values(state)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    state.restore()
    assert equal(values(state), synced), "a sync is saved: restore() brings back the synced values"
    state.check_host_updates()  # nothing changed: no HostsUpdatedInterrupt
    print("ok keras elastic state", flush=True)


def check_callbacks(rank, size):
    model = build(rank)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    state.sync()
    commits = []
    commit = state.commit

    def recording_commit():
        commits.append((state.batch, state.epoch))
        commit()
    state.commit = recording_commit
    callbacks = [hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]
    x, y = data(rank, batches=3)
    model.fit(x, y, batch_size=2, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    assert commits == [(1, 0), (0, 1), (0, 1), (2, 1), (0, 2)], commits
    assert state.batch == 0 and state.epoch == 2
    final = values(state)
    state.restore()
    assert equal(values(state), final) and same_on_every_rank(state)
    print("ok keras elastic callbacks", flush=True)


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_state(rank, size)
    check_callbacks(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()
