"""PartialDistributedOptimizer under model.fit: the shared layer's gradient is averaged across the
ranks, the local layer's stays this rank's own (divided by the number of ranks with Horovod's default
scale_local_gradients=True, undivided with False). After one SGD step each layer must equal the step
computed by hand from every rank's gradients. Prints 'ok keras partial'.
"""

import keras
import numpy as np
import tensorflow as tf

import hvdlite.tensorflow.keras as hvd

LR = 0.1


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    shared, local = keras.layers.Dense(3, name="shared"), keras.layers.Dense(1, name="local")
    return keras.Model(inputs, local(shared(inputs))), shared, local


def data(rank):
    generator = np.random.default_rng(rank)
    return generator.normal(size=(8, 4)).astype("float32"), generator.normal(size=(8, 1)).astype("float32")


def gradients_of(model, rank):
    x, y = data(rank)
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, model(x))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]


def check(scale_local_gradients: bool) -> None:
    rank, size = hvd.rank(), hvd.size()
    model, shared, local = build()
    before = [w.numpy() for w in model.trainable_weights]
    per_rank = [gradients_of(model, r) for r in range(size)]  # every rank's gradients, computed here
    optimizer = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(LR), local_layers=[local],
                                                scale_local_gradients=scale_local_gradients)
    model.compile(optimizer=optimizer, loss="mse")
    x, y = data(rank)
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    local_ids = {id(w) for w in local.trainable_weights}
    for index, weight in enumerate(model.trainable_weights):
        if id(weight) in local_ids:
            grad = per_rank[rank][index] / (size if scale_local_gradients else 1)
        else:
            grad = np.mean([g[index] for g in per_rank], axis=0)
        assert np.allclose(weight.numpy(), before[index] - LR * grad, atol=1e-6), (weight.name, scale_local_gradients)
    kernels = hvd.allgather_object(local.kernel.numpy().tolist())
    assert len({str(k) for k in kernels}) == size, "each rank's local layer trained on its own data"
    assert len({str(k) for k in hvd.allgather_object(shared.kernel.numpy().tolist())}) == 1


def main() -> None:
    hvd.init()
    check(scale_local_gradients=True)
    check(scale_local_gradients=False)
    try:
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(LR), local_layers=["not a layer"])
        raise AssertionError("a local layer that is not a layer must be refused")
    except ValueError as error:
        assert "keras.layers.Layer" in str(error), error
    print("ok keras partial", flush=True)


if __name__ == "__main__":
    main()
