"""Gradient compression for JAX arrays: the core's compressors with a ``jax.numpy`` cast.

The cast works on concrete and traced arrays alike, so compression also runs inside ``jax.jit``.
"""

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..compression import Compressor, build_compression


def _cast(array: Any, dtype: str) -> Any:
    return jnp.asarray(array).astype(np.dtype(dtype) if dtype != "bfloat16" else jnp.bfloat16)


def _dtype_name(array: Any) -> str:
    return np.dtype(jnp.result_type(array)).name


Compression = build_compression(_cast, _dtype_name)

__all__ = ["Compression", "Compressor"]
