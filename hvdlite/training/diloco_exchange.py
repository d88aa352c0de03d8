"""DiLoCo's exchange on NumPy arrays, for the adapters whose arrays reach the host (JAX, Keras).

The same codecs as torch's (:mod:`hvdlite.torch.slow_links.diloco_exchange`, where the reasons are given):
``None`` averages the pseudo-gradients in one grouped allreduce; ``"bf16"`` and ``"int8"`` encode
each rank's pseudo-gradients, allgather the encodings and decode and average them in float32, in
rank order, so every rank computes the same average. ``int8`` is blocks of :data:`BLOCK` values
with a float32 scale each (the block's largest magnitude / 127), and error feedback: what rounding
dropped is returned as the rank's new residual, to be added to its next pseudo-gradient.

The exchange is a function of its inputs (the residuals come in and go out), so that an adapter
keeps them in its own state: an optax state under ``jax.jit``, or a Keras object's attributes.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import api
from ..ops import Average
from ..process_sets import ProcessSet

BLOCK = 256  # elements per int8 scale, as in torch's exchange
COMPRESSIONS = (None, "bf16", "int8")


class Pending:
    """An exchange started: :meth:`wait` returns its result (the averaged pseudo-gradients) or raises its error."""

    def __init__(self, wait: Callable[[], Any]) -> None:
        self._wait = wait

    def wait(self) -> Any:
        return self._wait()


@dataclasses.dataclass
class InFlight:
    """An exchange sent after inner step ``sent_at``: its fragment, the parameters' local values then
    (None with ``delay`` 0: nothing to merge) and the exchange's pending average."""

    fragment: int
    sent_at: int
    anchors: list[Any] | None
    pending: Pending


def done(result: Any) -> Pending:
    """A pending exchange whose result is already known (run on the calling thread, or a checkpoint's)."""
    return Pending(lambda: result)


def settle(flight: InFlight) -> Any:
    """Wait for ``flight``'s exchange (to save it) and keep its result in it, so that training goes on
    as if nothing was saved: it lands at its own step."""
    result = flight.pending.wait()
    flight.pending = done(result)
    return result


def in_thread(work: Callable[[], Any]) -> Pending:
    """Run ``work`` on a helper thread (an exchange during the next inner steps: its blocking
    collectives run the engine's cycles themselves); the pending result raises what it raised."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as error:  # noqa: BLE001 - raised again on the training thread, in wait()
            result["error"] = error

    thread = threading.Thread(target=run, name="hvdlite-diloco-exchange", daemon=True)
    thread.start()

    def wait() -> Any:
        thread.join()
        if "error" in result:
            raise result["error"]
        return result["value"]

    return Pending(wait)


def check_compression(compression: object) -> str | None:
    """``compression`` if DiLoCo knows it (None, ``"bf16"``, ``"int8"``), else a ValueError."""
    if compression == "none":
        return None
    if compression not in COMPRESSIONS:
        raise ValueError(f"DiLoCo's compression must be None, 'bf16' or 'int8', got {compression!r}")
    return compression  # type: ignore[return-value]


def quantize_int8(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``flat`` (float32) as int8 values (padded to whole blocks) and one float32 scale per block."""
    padded = np.pad(flat.astype(np.float32, copy=False), (0, -flat.size % BLOCK)).reshape(-1, BLOCK)
    scales = (np.abs(padded).max(axis=1) / np.float32(127.0)).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1.0))
    values = np.clip(np.round(padded / safe[:, None]), -127, 127).astype(np.int8)
    return values.reshape(-1), scales


def dequantize_int8(values: np.ndarray, scales: np.ndarray, count: int) -> np.ndarray:
    """The float32 values :func:`quantize_int8` encoded, its padding dropped."""
    return (values.reshape(-1, BLOCK).astype(np.float32) * scales[:, None]).reshape(-1)[:count]


def to_bf16_bits(flat: np.ndarray) -> np.ndarray:
    """``flat`` rounded to bfloat16 (to nearest, ties to even, as torch and JAX round), as int16 bits."""
    bits = flat.astype(np.float32, copy=False).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype(np.uint16).view(np.int16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 ``bits`` (int16)."""
    return (bits.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def average_deltas(deltas: list[np.ndarray], residuals: list[np.ndarray] | None, compression: str | None,
                   process_set: ProcessSet, name: str) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """``deltas`` averaged over ``process_set`` (in their own shapes and dtypes), now, and int8's new
    residuals (flat float32, one per delta; None for the other codecs).

    ``residuals`` (int8 only): what this rank's rounding dropped last time, one per delta."""
    if compression is None:
        return api.grouped_allreduce(deltas, op=Average, name=name, process_set=process_set), None
    flats = [np.asarray(delta, dtype=np.float32).reshape(-1) for delta in deltas]
    if compression == "bf16":
        payload, new_residuals = [to_bf16_bits(flat) for flat in flats], None
    else:
        corrected = flats if residuals is None else [f + r for f, r in zip(flats, residuals, strict=True)]
        encoded = [quantize_int8(flat) for flat in corrected]
        payload = [part for pair in encoded for part in pair]
        new_residuals = [flat - dequantize_int8(*pair, flat.size) for flat, pair in zip(corrected, encoded, strict=True)]
    gathered = api.grouped_allgather(payload, name=name, process_set=process_set)
    return _decode_average(gathered, deltas, compression, process_set.size()), new_residuals


def _decode_average(gathered: list[np.ndarray], deltas: list[np.ndarray], compression: str,
                    size: int) -> list[np.ndarray]:
    """Decode every rank's encoding of each delta and average them, in rank order."""
    parts = 1 if compression == "bf16" else 2
    averages = []
    for index, delta in enumerate(deltas):
        count = int(np.size(delta))
        chunks = [np.split(gathered[index * parts + part], size) for part in range(parts)]
        total = np.zeros(count, dtype=np.float32)
        for rank in range(size):
            if compression == "bf16":
                total += from_bf16_bits(chunks[0][rank])
            else:
                total += dequantize_int8(chunks[0][rank], chunks[1][rank], count)
        averages.append((total / np.float32(size)).astype(np.asarray(delta).dtype).reshape(np.shape(delta)))
    return averages


__all__ = ["Pending", "InFlight", "settle", "done", "in_thread", "BLOCK", "check_compression", "quantize_int8", "dequantize_int8", "to_bf16_bits", "from_bf16_bits",
           "average_deltas"]
