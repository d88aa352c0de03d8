"""Moving ``jax.Array``s to and from the core's NumPy arrays, with no copy where JAX allows.

A CPU ``jax.Array`` is viewed as a read-only NumPy array for free. A NumPy result becomes a
``jax.Array`` through ``jax.device_put``, which adopts the buffer without copying when it is
64-byte aligned, as every core result is (``jnp.asarray`` would copy).

A concrete array on one GPU goes to the core as a :class:`~hvdlite.gpu.arrays.DeviceArray` over
its ``__cuda_array_interface__`` when hvdlite's GPU plane is installed (``hvdlite[gpu]``), and
results come back through DLPack. JAX does not expose the stream that produced an array, so the
adapter waits for it (``block_until_ready``) before handing it over. Inside ``jax.jit`` the
collectives are host callbacks, so XLA stages device data through host memory there.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...gpu import arrays as gpu_arrays
from ...utils import dtypes


def is_traced(value: Any) -> bool:
    """True while ``value`` is an abstract value inside ``jax.jit`` (or another JAX transformation)."""
    return isinstance(value, jax.core.Tracer)


def _gpu_device(value: Any) -> Any:
    """The GPU ``value`` lives on, if it is a single-device GPU array the GPU plane can take, else None."""
    if not isinstance(value, jax.Array):
        return None
    devices = value.devices()
    if len(devices) != 1:
        return None
    device = next(iter(devices))
    return device if device.platform == "gpu" and gpu_arrays.device_count() > 0 else None


def _device_array(value: jax.Array, device: Any) -> gpu_arrays.DeviceArray:
    name = dtypes.NAME_OF[np.dtype(value.dtype)]
    # cupy and the CUDA array interface have no bfloat16: hand over its bits (a new array; JAX
    # arrays are immutable, so no in-place form needs the original memory).
    view = jax.lax.bitcast_convert_type(value, jnp.uint16) if name == "bfloat16" else value
    view.block_until_ready()
    pointer = view.__cuda_array_interface__["data"][0]
    ordinal = getattr(device, "local_hardware_id", None)
    return gpu_arrays.DeviceArray(pointer, tuple(value.shape), dtypes.NUMPY_DTYPE[name],
                                  device.id if ordinal is None else ordinal, view)


def to_numpy(value: Any) -> np.ndarray | gpu_arrays.DeviceArray:
    """A NumPy view (CPU) or host copy of a concrete array or Python number; a GPU array's own
    memory (a :class:`DeviceArray`) when the GPU plane can take it."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        raise ValueError("hvdlite.jax works on arrays local to this process; got one sharded across processes")
    device = _gpu_device(value)
    if device is not None and np.dtype(value.dtype) in dtypes.NAME_OF:
        return _device_array(value, device)
    return np.asarray(value)  # an unsupported dtype reaches the core, which names it in its error


def to_jax(array: np.ndarray | gpu_arrays.DeviceArray, like: Any = None) -> jax.Array:
    """``array`` as a ``jax.Array`` on ``like``'s device (the default device for non-JAX inputs)."""
    if isinstance(array, gpu_arrays.DeviceArray):
        result = jax.dlpack.from_dlpack(gpu_arrays.cupy_view(array))
        if dtypes.is_bfloat16(array.dtype):
            result = jax.lax.bitcast_convert_type(result, jnp.bfloat16)
        return result.reshape(array.shape)
    device = None
    if isinstance(like, jax.Array):
        devices = like.devices()
        device = next(iter(devices)) if len(devices) == 1 else None
    return jax.device_put(array, device)


def canonical_dtype(dtype: Any) -> np.dtype:
    """The dtype JAX gives an array of ``dtype`` under the current x64 setting."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))
