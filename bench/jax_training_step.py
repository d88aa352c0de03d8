"""One data-parallel JAX + optax training step: hvdlite vs mpi4jax vs a host mpi4py loop vs no communication.

Run:  python bench/jax_training_step.py            (it launches its own hvdliterun job)

The driver starts one ``hvdliterun -np N`` job (``--np``, default 2) of this script in worker mode.
Every mode trains the same model from the same start; they run in the same job, interleaved rep
by rep, so drifting machine load affects them alike:

- ``nocomm``        each rank trains alone (jitted step, plain optax): the baseline, pure compute
                    plus the cost of sharing the machine.
- ``mpi4py``        the loop a user writes first: jitted gradients, then on the host one
                    ``Allreduce(IN_PLACE)`` per gradient leaf, divided by N, then a jitted update.
- ``mpi4jax``       one jitted step; gradients averaged with ``mpi4jax.allreduce`` per leaf, an XLA
                    custom call on the device buffers (skipped if mpi4jax is not installed: it
                    needs ``nanobind`` and ``pip install --no-build-isolation mpi4jax``).
- ``hvdlite``       one jitted step with ``hvdlite.jax.DistributedOptimizer``: the reduction is an
                    ordered ``io_callback`` into the core.
- ``hvdlite-host``  jitted gradients, ``hvdlite.jax.allreduce`` of the gradient pytree on the host
                    (outside jit), jitted update.

Model: an MLP 1024-2048-2048-2048-10 (10.5 M parameters, 8 tensors), Adam, batch 64 per rank,
one thread per rank (``NPROC=1``). Per rep each rank takes the median of its step times; the
rep's value is the slowest rank's. Reported: the median over reps, the spread (min-max of the
per-rep values) and each mode's step time relative to ``nocomm`` and to ``mpi4jax``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

ALL_MODES = ("nocomm", "mpi4py", "mpi4jax", "hvdlite", "hvdlite-host")
RESULT_TAG = "JAXSTEP_RESULT "
SKIP_TAG = "JAXSTEP_SKIP "
LAYERS = (1024, 2048, 2048, 2048, 10)
RANK_ENV = {"NPROC": "1", "OMP_NUM_THREADS": "1"}  # XLA_FLAGS thread options do not limit JAX 0.10; NPROC does


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode per rep")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per mode before the first rep")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions")
    parser.add_argument("--modes", default=",".join(ALL_MODES), help=f"comma-separated subset of {ALL_MODES}")
    parser.add_argument("--np", type=int, default=2, help="ranks")
    parser.add_argument("--batch-size", type=int, default=64, help="per-rank batch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # set by the driver
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in ALL_MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {list(ALL_MODES)}")
    return args


# ---------------------------------------------------------------- worker: runs inside hvdliterun


def init_params() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    key, params = jax.random.key(0), {}
    for i, (fan_in, fan_out) in enumerate(zip(LAYERS, LAYERS[1:], strict=False)):
        key, sub = jax.random.split(key)
        params[f"w{i}"] = jax.random.normal(sub, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in)
        params[f"b{i}"] = jnp.zeros(fan_out)
    return params


def loss_fn(params: dict[str, Any], x: Any, y: Any) -> Any:
    import jax
    import optax

    layers = len(params) // 2
    for i in range(layers):
        x = x @ params[f"w{i}"] + params[f"b{i}"]
        if i < layers - 1:
            x = jax.nn.relu(x)
    return optax.softmax_cross_entropy_with_integer_labels(x, y).mean()


def make_step(mode: str, batch: int, rank: int) -> Callable[[], None]:
    """Build one mode's own parameters, optimizer state and fixed batch; return a blocking step."""
    import jax
    import numpy as np
    import optax

    x = jax.random.normal(jax.random.key(rank + 1), (batch, LAYERS[0]))
    y = jax.random.randint(jax.random.key(rank + 100), (batch,), 0, LAYERS[-1])
    grad_fn = jax.jit(jax.grad(loss_fn))
    state: dict[str, Any] = {"params": init_params()}

    def jitted(tx: Any) -> Callable[[], None]:
        state["opt"] = tx.init(state["params"])

        @jax.jit
        def step(params: Any, opt_state: Any) -> Any:
            updates, opt_state = tx.update(jax.grad(loss_fn)(params, x, y), opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        def run() -> None:
            state["params"], state["opt"] = step(state["params"], state["opt"])
            jax.block_until_ready(state["params"])
        return run

    def host_reduced(reduce: Callable[[Any], Any]) -> Callable[[], None]:
        tx = optax.adam(1e-4)
        state["opt"] = tx.init(state["params"])

        @jax.jit
        def apply(params: Any, opt_state: Any, grads: Any) -> Any:
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        def run() -> None:
            grads = reduce(grad_fn(state["params"], x, y))
            state["params"], state["opt"] = apply(state["params"], state["opt"], grads)
            jax.block_until_ready(state["params"])
        return run

    if mode == "nocomm":
        return jitted(optax.adam(1e-4))
    if mode == "hvdlite":
        import hvdlite.jax as hvd

        return jitted(hvd.DistributedOptimizer(optax.adam(1e-4)))
    if mode == "hvdlite-host":
        import hvdlite.jax as hvd

        return host_reduced(lambda grads: hvd.allreduce(grads, name="bench.grads"))
    if mode == "mpi4py":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD

        def mpi4py_reduce(grads: Any) -> Any:
            # np.array(..., copy=True): a jax.Array's NumPy view is read-only.
            host = jax.tree.map(lambda g: np.array(g, copy=True), grads)
            for leaf in jax.tree.leaves(host):
                comm.Allreduce(MPI.IN_PLACE, leaf)
                leaf /= comm.Get_size()
            return host
        return host_reduced(mpi4py_reduce)
    import mpi4jax
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()

    def mean_updates(updates: Any, opt_state: Any, params: Any = None) -> Any:
        return jax.tree.map(lambda g: mpi4jax.allreduce(g, op=MPI.SUM) / size, updates), opt_state

    return jitted(optax.chain(optax.GradientTransformation(lambda p: optax.EmptyState(), mean_updates),
                              optax.adam(1e-4)))


def unavailable(mode: str) -> str | None:
    """Why ``mode`` cannot run here, or None."""
    try:
        if mode == "mpi4jax":
            import mpi4jax  # noqa: F401
        elif mode.startswith("hvdlite"):
            import hvdlite.jax  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def idle_until_all_arrive(comm: Any) -> None:
    """Wait for every rank without spinning a core (a blocking MPICH barrier busy-polls)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.001)


def run_worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    names = []
    for mode in args.modes:
        reason = unavailable(mode)
        if reason is None:
            names.append(mode)
        elif comm.Get_rank() == 0:
            print(SKIP_TAG + json.dumps({"mode": mode, "reason": reason}), flush=True)
    if any(n.startswith("hvdlite") for n in names):
        import hvdlite.jax as hvd

        hvd.init()
    steps = {name: make_step(name, args.batch_size, comm.Get_rank()) for name in names}
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    per_rep: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.reps):
        for name, step in steps.items():  # interleaved, so drifting load affects every mode alike
            idle_until_all_arrive(comm)
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
            per_rep[name].append(max(comm.allgather(statistics.median(times))))
    if comm.Get_rank() == 0:
        for name, values in per_rep.items():
            print(RESULT_TAG + json.dumps({"mode": name, "rep_s": values}), flush=True)
    idle_until_all_arrive(comm)


# ---------------------------------------------------------------- driver: launches the job, reports


def launch(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, str]]:
    beside = os.path.join(os.path.dirname(sys.executable), "hvdliterun")  # works without an activated venv
    command = [beside if os.path.exists(beside) else "hvdliterun", "-np", str(args.np), sys.executable,
               os.path.abspath(__file__), "--worker", "--modes", ",".join(args.modes), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--reps", str(args.reps), "--batch-size", str(args.batch_size)]
    print("$ " + " ".join(command), flush=True)
    proc = subprocess.run(command, env={**os.environ, **RANK_ENV}, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"job failed with exit code {proc.returncode}: {' '.join(command)}")
    results: dict[str, list[float]] = {}
    skipped: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        match = re.search(f"({RESULT_TAG}|{SKIP_TAG})(.*)$", line)
        if match:
            payload = json.loads(match.group(2))
            if match.group(1) == RESULT_TAG:
                results[payload["mode"]] = payload["rep_s"]
            else:
                skipped[payload["mode"]] = payload["reason"]
    return results, skipped


def report(results: dict[str, list[float]], skipped: dict[str, str], args: argparse.Namespace) -> None:
    params = sum(a * b + b for a, b in zip(LAYERS, LAYERS[1:], strict=False))
    print(f"\nJAX training step, np={args.np}: MLP {'-'.join(map(str, LAYERS))} ({params / 1e6:.1f} M parameters), "
          f"Adam, batch {args.batch_size} per rank, 1 thread per rank; {args.reps} reps x {args.steps} steps "
          "(median [min-max of per-rep medians])")
    medians = {name: statistics.median(values) for name, values in results.items()}
    print(f"{'mode':>13} | {'step ms':>22} | {'vs nocomm':>9} | {'vs mpi4jax':>10}")
    for name in ALL_MODES:
        if name not in results:
            continue
        values = results[name]
        step = f"{medians[name] * 1e3:7.1f} [{min(values) * 1e3:.1f}-{max(values) * 1e3:.1f}]"
        base = f"{medians[name] / medians['nocomm']:9.2f}" if "nocomm" in medians else f"{'-':>9}"
        versus = f"{medians[name] / medians['mpi4jax']:10.2f}" if "mpi4jax" in medians else f"{'-':>10}"
        print(f"{name:>13} | {step:>22} | {base} | {versus}")
    for name, reason in skipped.items():
        print(f"{name:>13} | skipped: {reason}")


def main() -> None:
    args = parse_args()
    if args.worker:
        run_worker(args)
    else:
        report(*launch(args), args)


if __name__ == "__main__":
    main()
