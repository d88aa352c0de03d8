"""TensorFlow 1 style training in a tf.compat.v1 graph, as a Horovod TF1 script does it.

hvd.DistributedOptimizer wraps tf.compat.v1.train optimizers (plain gradient descent, and a user
subclass of the momentum optimizer that overrides compute_gradients), and
hvd.BroadcastGlobalVariablesHook starts a MonitoredTrainingSession. Every rank initialises its
variable differently: after the hook it holds its set's root value, and after the steps it equals one
process trained on the set's whole batch. Usage: tf1_training.py global|sets ("sets": the even and
the odd ranks train separately, each a process set). Prints 'ok tf1 training <mode>'.
"""

import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import hvdlite.tensorflow as hvd  # noqa: E402

STEPS, BATCH = 3, 4


class Halved(tf.compat.v1.train.MomentumOptimizer):
    """A user's optimizer with its own compute_gradients: DistributedOptimizer must keep calling it."""

    calls = 0

    def compute_gradients(self, *args, **kwargs):
        Halved.calls += 1
        return [(g * 0.5, v) for g, v in super().compute_gradients(*args, **kwargs)]


OPTIMIZERS = {"sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
              "halved_momentum": lambda: Halved(0.1, momentum=0.9)}


def batches(members: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(5)
    return generator.normal(size=(STEPS, BATCH * members, 3)), generator.normal(size=(STEPS, BATCH * members, 1))


def train(make_optimizer, initial: float, x, y, process_set=None) -> tuple[np.ndarray, np.ndarray]:
    """(the variable after the session started, after the steps); distributed with a process set."""
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=np.full((3, 1), initial))
        x_in, y_in = tf.compat.v1.placeholder(tf.float64, [None, 3]), tf.compat.v1.placeholder(tf.float64, [None, 1])
        loss = tf.reduce_mean((tf.matmul(x_in, w) - y_in) ** 2)
        optimizer = make_optimizer()
        hooks = []
        if process_set is not None:
            optimizer = hvd.DistributedOptimizer(optimizer, process_set=process_set)
            hooks = [hvd.BroadcastGlobalVariablesHook(process_set.ranks[0], process_set=process_set)]
        step = optimizer.minimize(loss)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as session:
            started = session.run(w)
            for index in range(STEPS):
                session.run(step, feed_dict={x_in: x[index], y_in: y[index]})
            return started, session.run(w)


def main(mode: str) -> None:
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    if mode == "sets":
        sets = [hvd.ProcessSet([r for r in range(size) if r % 2 == parity]) for parity in (0, 1)]
        hvd.init(process_sets=sets)
        mine = sets[rank % 2]
    else:
        hvd.init()
        mine = hvd.global_process_set
    root = mine.ranks[0] if mine.ranks else 0
    x, y = batches(mine.size())
    place = slice(mine.rank() * BATCH, (mine.rank() + 1) * BATCH)
    for name, make in OPTIMIZERS.items():
        calls = Halved.calls
        started, trained = train(make, rank + 1.0, x[:, place], y[:, place], process_set=mine)
        assert np.array_equal(started, np.full((3, 1), root + 1.0)), (name, started)  # the hook broadcast the root's
        _, expected = train(make, root + 1.0, x, y)  # one process on the set's whole batch
        assert np.allclose(trained, expected, atol=1e-12), (name, trained, expected)
        assert name != "halved_momentum" or Halved.calls == calls + 2, Halved.calls  # the user's override ran
    print(f"ok tf1 training {mode}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
