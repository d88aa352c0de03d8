"""Synthetic training throughput with hvdlite.tensorflow: Horovod's tensorflow2_synthetic_benchmark.py.

Run:  hvdliterun -np 2 python examples/tensorflow2_synthetic_benchmark.py [--model mlp|resnet|ResNet50] [--eager]

Same flags and output lines as Horovod's ``examples/tensorflow2/tensorflow2_synthetic_benchmark.py``
(``Number of CPUs`` when it runs on CPU). ``--model`` is ``mlp`` or ``resnet`` (small models defined
here, the default, so a CPU run takes seconds) or the name of any ``keras.applications`` model,
built with ``weights=None`` so nothing is downloaded. The train step uses DistributedGradientTape
inside ``tf.function`` (``--eager`` runs it eagerly); rank 0's weights are broadcast after the
first step, as in Horovod's script.
"""

from __future__ import annotations

import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="TensorFlow Synthetic Benchmark",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--model", type=str, default="resnet",
                        help="mlp, resnet, or a keras.applications model name (e.g. ResNet50)")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--num-warmup-batches", type=int, default=2,
                        help="number of warm-up batches that don't count towards benchmark")
    parser.add_argument("--num-batches-per-iter", type=int, default=5,
                        help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=5, help="number of benchmark iterations")
    parser.add_argument("--image-size", type=int, default=32, help="height and width of the synthetic images")
    parser.add_argument("--num-classes", type=int, default=10, help="number of output classes")
    parser.add_argument("--eager", action="store_true", default=False, help="enables eager execution")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
    return parser.parse_args()


def build_model(args: argparse.Namespace) -> keras.Model:
    shape = (args.image_size, args.image_size, 3)
    if args.model == "mlp":
        return keras.Sequential([keras.Input(shape), keras.layers.Flatten(), keras.layers.Dense(512, "relu"),
                                 keras.layers.Dense(512, "relu"), keras.layers.Dense(args.num_classes)])
    if args.model == "resnet":
        inputs = keras.Input(shape)
        x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
        for width in (16, 32, 64):
            shortcut = keras.layers.Conv2D(width, 1, strides=2)(x)
            x = keras.layers.Conv2D(width, 3, strides=2, padding="same", activation="relu")(x)
            x = keras.layers.Conv2D(width, 3, padding="same")(x)
            x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x) + shortcut)
        x = keras.layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, keras.layers.Dense(args.num_classes)(x))
    return getattr(keras.applications, args.model)(weights=None, input_shape=shape, classes=args.num_classes)


def log(message: str) -> None:
    if hvd.rank() == 0:
        print(message, flush=True)


def main() -> None:
    args = parse_args()
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU") if not args.no_cuda else []
    if gpus:  # one GPU per rank on each machine
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    device = "GPU" if gpus else "CPU"
    model = build_model(args)
    optimizer = keras.optimizers.SGD(0.01 * hvd.size())  # size() times the batch: scale the rate with it
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    target = tf.random.uniform([args.batch_size], minval=0, maxval=args.num_classes, dtype=tf.int64)

    def benchmark_step(first_batch: bool) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        # After the first step the optimizer's slots exist: start every rank from rank 0's state.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)

    step = benchmark_step if args.eager else tf.function(benchmark_step)
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device}s: {hvd.size()}")
    step(first_batch=True)
    log("Running warmup...")
    timeit.timeit(lambda: step(first_batch=False), number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for iteration in range(args.num_iters):
        elapsed = timeit.timeit(lambda: step(first_batch=False), number=args.num_batches_per_iter)
        img_secs.append(args.batch_size * args.num_batches_per_iter / elapsed)
        log(f"Iter #{iteration}: {img_secs[-1]:.1f} img/sec per {device}")
    mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    log(f"Img/sec per {device}: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
