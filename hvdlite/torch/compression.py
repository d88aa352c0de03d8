"""Gradient compression for torch tensors: the core's compressors with a torch cast."""

from ..compression import Compressor, build_compression
from .collectives.tensors import cast, core_dtype

Compression = build_compression(cast, core_dtype)

__all__ = ["Compression", "Compressor"]
