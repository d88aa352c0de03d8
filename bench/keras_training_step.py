"""One Keras 3 ``model.fit`` training step: hvdlite at N ranks vs one rank vs MultiWorkerMirroredStrategy.

Run:  python bench/keras_training_step.py            (it launches its own jobs)

Modes, each a separate job, run in turn for ``--reps`` rounds so drifting machine load hits them alike:

- ``single``   ``hvdliterun -np 1``: one process, plain optimizer, no communication. The baseline.
- ``hvdlite``  ``hvdliterun -np N``: ``hvdlite.tensorflow.keras.DistributedOptimizer`` in ``model.fit``.
- ``hvdlite-tape``  ``hvdliterun -np N``: the same model in a ``tf.function`` loop with
               ``hvdlite.tensorflow.DistributedGradientTape``, the loop ``mwms`` runs.
- ``mwms``     N plain processes under ``tf.distribute.MultiWorkerMirroredStrategy`` (gRPC and ring
               collectives over 127.0.0.1), configured through ``TF_CONFIG``. Keras 3.15's ``model.fit``
               fails under this strategy here (it cannot convert the PerReplica batch to a tensor), so
               this mode runs the same model and optimizer in a ``strategy.run`` loop inside ``tf.function``.

Model: ``--depth`` x Dense(``--width``) with ReLU (defaults 20 x 704: 9.9 M parameters, 40 tensors),
SGD, batch 32 per rank, one TensorFlow thread per rank. Each process times ``model.fit`` batch to
batch (a callback stamps every batch end) and reports the median after warm-up; a job's value is its
slowest rank's median. Reported: the median over reps, the min-max spread, and the scaling efficiency
(single step time / mode step time: the per-rank batch is fixed, so 1.0 is perfect weak scaling).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

RESULT_TAG = "KERASSTEP_RESULT "
MODES = ("single", "hvdlite", "hvdlite-tape", "mwms")
RANK_ENV = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=15, help="timed steps per job")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per job (tracing included)")
    parser.add_argument("--reps", type=int, default=3, help="rounds of all modes")
    parser.add_argument("--np", type=int, default=2, help="ranks (workers) in the multi-rank modes")
    parser.add_argument("--width", type=int, default=704)
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {MODES}")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--task", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ports", default="", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---------------------------------------------------------------- worker: one process of one job
def build_model(args: argparse.Namespace):
    import keras

    keras.utils.set_random_seed(0)
    layers = [keras.Input((args.width,))]
    layers += [keras.layers.Dense(args.width, activation="relu") for _ in range(args.depth - 1)]
    return keras.Sequential(layers + [keras.layers.Dense(args.width)])


def timed_fit(args: argparse.Namespace, model, batch: int) -> float:
    """Median seconds per step of ``model.fit`` after the warm-up steps."""
    import keras
    import numpy as np

    stamps: list[float] = []
    stamp = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs=None: stamps.append(time.perf_counter()))
    steps = args.warmup + args.steps
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(batch * steps, args.width)).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, x)).batch(batch)
    options = tf.data.Options()
    # Every worker reads the same synthetic rows; MultiWorkerMirroredStrategy splits each batch itself.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    model.fit(data.with_options(options), epochs=1, verbose=0, callbacks=[stamp])
    return statistics.median(np.diff(stamps[args.warmup - 1:]))


def loop_time(args: argparse.Namespace, step) -> float:
    """Median seconds per call of ``step`` (a tf.function) after the warm-up calls."""
    times = []
    for index in range(args.warmup + args.steps):
        start = time.perf_counter()
        step()
        if index >= args.warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def tape_step(model, optimizer, xb, yb, global_batch: int, wrap_tape=None) -> None:
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.reduce_mean(tf.square(model(xb, training=True) - yb), axis=-1)) / global_batch
    tape = wrap_tape(tape) if wrap_tape else tape
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)


def strategy_loop(args: argparse.Namespace, strategy, model, optimizer, workers: int) -> float:
    """Seconds per step of a ``strategy.run`` loop (Keras 3.15's fit fails under MWMS here)."""
    import numpy as np
    import tensorflow as tf

    global_batch = args.batch_size * workers
    x = np.random.default_rng(0).normal(size=(global_batch, args.width)).astype(np.float32)
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, x)).batch(global_batch))
    xb, yb = next(iter(data))
    return loop_time(args, tf.function(
        lambda: strategy.run(lambda a, b: tape_step(model, optimizer, a, b, global_batch), args=(xb, yb))))


def hvdlite_tape_loop(args: argparse.Namespace, model, optimizer) -> float:
    """Seconds per step of the same loop with hvdlite's DistributedGradientTape instead of a strategy."""
    import numpy as np
    import tensorflow as tf

    import hvdlite.tensorflow as hvd_tf

    x = tf.constant(np.random.default_rng(0).normal(size=(args.batch_size, args.width)).astype(np.float32))
    return loop_time(args, tf.function(
        lambda: tape_step(model, optimizer, x, x, args.batch_size, hvd_tf.DistributedGradientTape)))


def worker(args: argparse.Namespace) -> None:
    import keras

    if args.worker == "mwms":
        import tensorflow as tf

        ports = args.ports.split(",")
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                              "task": {"type": "worker", "index": args.task}})
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = build_model(args)
            optimizer = keras.optimizers.SGD(1e-3)
        seconds, rank = strategy_loop(args, strategy, model, optimizer, len(ports)), args.task
    else:
        import hvdlite.tensorflow.keras as hvd

        hvd.init()
        optimizer = keras.optimizers.SGD(1e-3)
        if args.worker == "hvdlite-tape":
            seconds = hvdlite_tape_loop(args, build_model(args), optimizer)
            print(RESULT_TAG + json.dumps({"rank": hvd.rank(), "seconds": seconds}), flush=True)
            return
        if args.worker == "hvdlite":
            optimizer = hvd.DistributedOptimizer(optimizer)
        model = build_model(args)
        model.compile(optimizer=optimizer, loss="mse")
        seconds, rank = timed_fit(args, model, args.batch_size), hvd.rank()
    print(RESULT_TAG + json.dumps({"rank": rank, "seconds": seconds}), flush=True)


# ---------------------------------------------------------------- driver
def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def run_job(mode: str, args: argparse.Namespace, forwarded: list[str]) -> float:
    """Run one job of ``mode``; returns its slowest rank's median step time."""
    env = {**os.environ, **RANK_ENV}
    script = [sys.executable, os.path.abspath(__file__), "--worker", mode, *forwarded]
    if mode == "mwms":
        ports = ",".join(map(str, free_ports(args.np)))
        procs = [subprocess.Popen(script + ["--task", str(i), "--ports", ports], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(args.np)]
        outputs = [p.communicate(timeout=600)[0] for p in procs]
        failed = any(p.returncode for p in procs)
        output = "\n".join(outputs)
    else:
        ranks = 1 if mode == "single" else args.np
        hvdliterun = os.path.join(os.path.dirname(sys.executable), "hvdliterun")
        done = subprocess.run([hvdliterun, "-np", str(ranks), *script], env=env, text=True,
                              capture_output=True, timeout=600)
        failed, output = done.returncode != 0, done.stdout + done.stderr
    results = [json.loads(line.split(RESULT_TAG, 1)[1]) for line in output.splitlines() if RESULT_TAG in line]
    if failed or not results:
        raise RuntimeError(f"{mode} job failed:\n{output[-3000:]}")
    return max(r["seconds"] for r in results)


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    forwarded = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--width", str(args.width),
                 "--depth", str(args.depth), "--batch-size", str(args.batch_size)]
    times: dict[str, list[float]] = {m: [] for m in modes}
    skipped: dict[str, str] = {}
    for rep in range(args.reps):
        for mode in modes:
            if mode in skipped:
                continue
            try:
                times[mode].append(run_job(mode, args, forwarded))
            except RuntimeError as exc:
                skipped[mode] = str(exc).splitlines()[-1]
            else:
                print(f"rep {rep} {mode}: {times[mode][-1] * 1e3:.1f} ms/step", flush=True)
    params = args.depth * (args.width * args.width + args.width)
    print(f"\nKeras model.fit step, {args.depth} x Dense({args.width}) = {params / 1e6:.1f} M parameters, "
          f"batch {args.batch_size}/rank, np={args.np}, {args.reps} reps")
    base = statistics.median(times["single"]) if times.get("single") else None
    for mode in modes:
        if mode in skipped:
            print(f"{mode:>12}: skipped ({skipped[mode]})")
            continue
        median = statistics.median(times[mode])
        efficiency = f"   efficiency {base / median:.2f}" if base else ""
        print(f"{mode:>12}: {median * 1e3:7.1f} ms/step  (spread {min(times[mode]) * 1e3:.1f}-"
              f"{max(times[mode]) * 1e3:.1f}){efficiency}")


if __name__ == "__main__":
    main()
