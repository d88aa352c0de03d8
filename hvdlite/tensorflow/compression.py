"""Gradient compression for TensorFlow tensors: the core's compressors with a TensorFlow cast."""

from ..compression import Compressor, NoneCompressor, build_compression
from .collectives.tensors import cast, core_dtype

Compression = build_compression(cast, core_dtype)

__all__ = ["Compression", "Compressor", "NoneCompressor"]
