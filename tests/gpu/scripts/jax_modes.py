"""Every optax ``DistributedOptimizer`` mode on GPU arrays against the same training on CPU arrays, in one job.

Usage: ``hvdliterun -np N python tests/gpu/scripts/jax_modes.py [--device gpu|cpu] [--modes a,b]``.

For each mode (see MODES) every rank places the same initial parameters (NumPy, seed 0) on a CPU
device and on ``--device`` (``jax.devices("gpu")``), wraps the mode's optax transformation in two
``hvd.DistributedOptimizer`` (named ``<mode>.cpu`` and ``<mode>.device``) and trains both STEPS
steps on the same per-rank data, eagerly or jitted as the mode says: the CPU copy through hvdlite
is the reference. It compares the two copies (a tolerance per mode: loose for fp16/bf16
compression), checks that the device copy stayed on its device, that training moved it, and that
it is the same on every rank that averaged it. A mode's failure does not stop the job: every rank
reports its own problems at a common point, the next mode runs, and the job exits 1 at the end.
Each rank prints ``ok jax <mode>`` per passing mode, else ``FAILED jax <mode>: ...``. With
``--device cpu`` both copies are on the CPU (run with JAX_PLATFORMS=cpu, set here): that checks
this script's logic on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["gpu", "cuda", "cpu"], default="gpu", help="cuda is gpu")
    parser.add_argument("--modes", default=None, help="comma-separated; default: all")
    return parser.parse_args()


ARGUMENTS = _arguments()  # before jax is imported: the platforms are chosen then
if ARGUMENTS.device == "cpu":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Ranks share the GPU: each takes memory as it needs it, not 75% of it up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import verdict  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402

# float32 matrix products in float32 on the GPU too (JAX's default there is TensorFloat-32, which
# alone would differ from the CPU by ~1e-3): the comparison is of hvdlite, not of the matmul units.
jax.config.update("jax_default_matmul_precision", "highest")
FEATURES, HIDDEN, CLASSES, PER_RANK, STEPS = 12, 16, 3, 4, 5
LOCAL_SGD = {"local_sgd_period": 2, "local_sgd_warmup_steps": 1}


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # DistributedOptimizer's keyword arguments
    optimizer: str = "sgd"  # sgd (momentum) or adam
    passes: int = 1  # micro-batches (update calls) per step
    jit: bool = False  # the train step under jax.jit (collectives as io_callbacks) or eager
    tolerance: float = 1e-4  # rtol and atol of device against CPU
    subset: bool = False  # averaged over the process set of the even ranks only

    @property
    def exact_across_ranks(self) -> bool:
        """Local SGD lands each rank on p + (mean - p), which may round differently per rank. PowerSGD
        orthogonalizes the averaged P on each rank: on a GPU, eager JAX autotunes its matrix products in
        each process and two processes may pick kernels that round differently (seen on an H200 at np=2:
        2.98e-08 apart after 5 steps, while every averaged tensor was identical)."""
        if "local_sgd_period" in self.options:
            return False
        compression = self.options.get("compression")
        return compression is None or compression in (hvd.Compression.fp16, hvd.Compression.bf16)


def modes() -> list[Mode]:
    powersgd = {"compression": hvd.Compression.powersgd(rank=2, start_step=1)}
    return [
        Mode("plain"),
        Mode("plain_jit", jit=True),
        Mode("backward_passes_per_step", {"backward_passes_per_step": 2}, passes=2),
        Mode("backward_passes_per_step_jit", {"backward_passes_per_step": 2}, passes=2, jit=True),
        Mode("shard_optimizer_state", {"shard_optimizer_state": True}, optimizer="adam"),
        Mode("shard_optimizer_state_jit", {"shard_optimizer_state": True}, optimizer="adam", jit=True),
        Mode("local_sgd", {**LOCAL_SGD, "local_sgd_average_state": True}),
        Mode("local_sgd_adam_jit", {**LOCAL_SGD, "local_sgd_average_state": True}, optimizer="adam", jit=True),
        # w1 (12x16) is compressed at rank 2 ((12 + 16) * 2 * 2 < 192); w2 (16x3) is not.
        Mode("powersgd", powersgd),
        Mode("powersgd_jit", powersgd, jit=True),
        # Rounded to 16 bits on the way: a gradient rounds to the other neighbour when CPU and GPU differ in its last bits.
        Mode("fp16", {"compression": hvd.Compression.fp16}, tolerance=2e-3),
        Mode("bf16", {"compression": hvd.Compression.bf16}, tolerance=1e-2),
        Mode("process_set", subset=True),
        Mode("process_set_jit", subset=True, jit=True),
    ]


def initial() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w1": (rng.standard_normal((FEATURES, HIDDEN)) * 0.3).astype(np.float32),
            "b1": np.zeros(HIDDEN, np.float32),
            "w2": (rng.standard_normal((HIDDEN, CLASSES)) * 0.3).astype(np.float32),
            "b2": np.zeros(CLASSES, np.float32)}


def batch(step: int, micro: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s data for one micro-batch (NumPy; placed on each copy's device by the caller)."""
    rng = np.random.default_rng([step, micro, rank])
    x = (rng.standard_normal((PER_RANK, FEATURES)) * (rank + 1)).astype(np.float32)
    return x, rng.integers(0, CLASSES, PER_RANK).astype(np.int32)


def loss_fn(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def base_tx(mode: Mode) -> optax.GradientTransformation:
    if mode.optimizer == "adam":
        # eps well above float32 noise: Adam's first steps are about sign(gradient), and a gradient
        # element near zero could take another sign on the GPU and move by 2 * lr.
        return optax.adam(0.01, eps=1e-4)
    return optax.sgd(0.1, momentum=0.9)


def train(mode: Mode, device: jax.Device, side: str, process_set: Any) -> dict:
    """STEPS steps of a copy of the parameters on ``device`` through its own DistributedOptimizer."""
    tx = hvd.DistributedOptimizer(base_tx(mode), name=f"{mode.name}.{side}", process_set=process_set,
                                  **mode.options)

    def step(params: dict, state: Any, x: jax.Array, y: jax.Array) -> tuple[dict, Any]:
        updates, state = tx.update(jax.grad(loss_fn)(params, x, y), state, params)
        return optax.apply_updates(params, updates), state

    run = jax.jit(step) if mode.jit else step
    params = jax.device_put(initial(), device)
    state = tx.init(params)
    for at in range(STEPS):
        for micro in range(mode.passes):  # the updates are zeros until the last micro-batch
            params, state = run(params, state, *jax.device_put(batch(at, micro, hvd.rank()), device))
    return params


def differences(mode: Mode, reference: dict, got: dict, device: jax.Device) -> list[str]:
    """What differs between the CPU reference and the device copy (nothing raised: every rank goes on)."""
    problems = []
    for name, want in reference.items():
        if got[name].devices() != {device}:
            problems.append(f"{name} is on {got[name].devices()}, not {device}")
        try:
            np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want), rtol=mode.tolerance,
                                       atol=mode.tolerance)
        except AssertionError as error:
            problems.append(f"{name} on {device.platform} != on cpu: {error}".replace("\n", " "))
    moved = max(float(np.abs(np.asarray(reference[k]) - v).max()) for k, v in initial().items())
    if moved < 1e-3:
        problems.append(f"training did not move the parameters (max change {moved:.1e})")
    return problems


def spread(mode: Mode, params: dict, process_set: Any) -> list[str]:
    """The device copy must be the same on every rank of the set (this is a collective of the set)."""
    flat = jnp.concatenate([jnp.ravel(params[k]) for k in sorted(params)])
    every = np.asarray(hvd.allgather(flat[None, :], name=f"{mode.name}.same", process_set=process_set))
    off = float(np.abs(every - np.asarray(flat)).max())
    allowed = 0.0 if mode.exact_across_ranks else 1e-6
    return [] if off <= allowed else [f"the parameters differ across ranks by up to {off:.2e}"]


def run_mode(mode: Mode, device: jax.Device, even: Any) -> bool:
    """Train ``mode`` on both copies, compare, and print this rank's verdict; True if every rank passed."""
    process_set = even if mode.subset else hvd.global_process_set
    problems: list[str] = []
    try:
        reference = train(mode, jax.devices("cpu")[0], "cpu", process_set)
        got = train(mode, device, "device", process_set)
        problems = differences(mode, reference, got, device)
        if process_set.included():
            problems += spread(mode, got, process_set)
    except Exception as error:  # noqa: BLE001 - reported with the others below; hvdlite raises on every rank
        problems.append(f"{type(error).__name__}: {error}")
    return verdict.report("jax", mode.name, problems)


def main(device_kind: str, chosen: str | None) -> None:
    hvd.init(process_sets="dynamic")
    local = jax.devices(device_kind)
    device = local[hvd.local_rank() % len(local)]
    evens = list(range(0, hvd.size(), 2))
    # At np=1 the even ranks are the whole job: the global set is that set (registering it twice is refused).
    even = hvd.add_process_set(evens) if len(evens) < hvd.size() else hvd.global_process_set
    table = {m.name: m for m in modes()}
    results = [run_mode(table[name], device, even) for name in (chosen.split(",") if chosen else table)]
    hvd.shutdown()
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main("gpu" if ARGUMENTS.device == "cuda" else ARGUMENTS.device, ARGUMENTS.modes)
