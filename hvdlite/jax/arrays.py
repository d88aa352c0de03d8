"""Moving ``jax.Array``s to and from the core's NumPy arrays, with no copy where JAX allows.

A CPU ``jax.Array`` is viewed as a read-only NumPy array for free. A NumPy result becomes a
``jax.Array`` through ``jax.device_put``, which adopts the buffer without copying when it is
64-byte aligned, as every core result is (``jnp.asarray`` would copy). On a GPU both directions
copy through host memory; that is the host-staged path.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def is_traced(value: Any) -> bool:
    """True while ``value`` is an abstract value inside ``jax.jit`` (or another JAX transformation)."""
    return isinstance(value, jax.core.Tracer)


def to_numpy(value: Any) -> np.ndarray:
    """A NumPy view (CPU) or host copy (accelerator) of a concrete array or Python number."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        raise ValueError("hvdlite.jax works on arrays local to this process; got one sharded across processes")
    return np.asarray(value)


def to_jax(array: np.ndarray, like: Any = None) -> jax.Array:
    """``array`` as a ``jax.Array`` on ``like``'s device (the default device for non-JAX inputs)."""
    device = None
    if isinstance(like, jax.Array):
        devices = like.devices()
        device = next(iter(devices)) if len(devices) == 1 else None
    return jax.device_put(array, device)


def canonical_dtype(dtype: Any) -> np.dtype:
    """The dtype JAX gives an array of ``dtype`` under the current x64 setting."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))
