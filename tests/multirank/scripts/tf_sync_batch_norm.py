"""hvd.SyncBatchNormalization against keras.layers.BatchNormalization on the whole batch.

Ranks hold different numbers of samples (rank r: 2 * (r + 1)); the loss is a weighted sum over
samples, so each rank's input gradient must equal the whole-batch gradient's rows for its samples.
Checks outputs, input gradients, summed scale/offset gradients and moving statistics, eagerly and
in tf.function, channels last and channels first. Prints 'ok tf sync batch norm'.
"""

import keras
import numpy as np
import tensorflow as tf

import hvdlite.tensorflow as hvd


def check(shape, axis, compiled, seed):
    size, rank = hvd.size(), hvd.rank()
    rng = np.random.default_rng(seed)
    counts = [2 * (r + 1) for r in range(size)]
    x = rng.normal(size=(sum(counts), *shape)) * 3 + 1
    weights = rng.normal(size=x.shape)
    start = sum(counts[:rank])
    mine = slice(start, start + counts[rank])
    reference = keras.layers.BatchNormalization(axis=axis, dtype="float64")
    synced = hvd.SyncBatchNormalization(axis=axis, dtype="float64", name=f"sbn_{seed}")
    reference.build(x.shape)
    synced.build(x.shape)

    def run(layer, inputs, w):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = layer(inputs, training=True)
            loss = tf.reduce_sum(out * w)
        return (out, *tape.gradient(loss, [inputs, layer.gamma, layer.beta]))

    step = tf.function(run) if compiled else run
    for factor in (1.0, 2.0):
        ref = run(reference, tf.constant(x * factor), tf.constant(weights))
        got = step(synced, tf.constant(x[mine] * factor), tf.constant(weights[mine]))
        assert np.allclose(got[0], ref[0][mine], atol=1e-9), "outputs"
        assert np.allclose(got[1], ref[1][mine], atol=1e-9), (got[1], ref[1][mine])
        summed = hvd.grouped_allreduce([got[2], got[3]], op=hvd.Sum)
        assert np.allclose(summed[0], ref[2], atol=1e-8) and np.allclose(summed[1], ref[3], atol=1e-8), "scale/offset"
    assert np.allclose(synced.moving_mean.numpy(), reference.moving_mean.numpy(), atol=1e-10)
    assert np.allclose(synced.moving_variance.numpy(), reference.moving_variance.numpy(), atol=1e-10)


def main():
    hvd.init()
    check((3,), -1, False, 1)
    check((4, 5), 1, True, 2)
    check((2, 3), -1, True, 3)
    hvd.shutdown()
    print("ok tf sync batch norm", flush=True)


if __name__ == "__main__":
    main()
