"""Device memory as the core sees it: a pointer, a shape and dtype, and when it is ready.

Adapters wrap a framework's device tensor in a :class:`DeviceArray` without copying (torch:
``data_ptr()`` and its current stream; JAX: ``__cuda_array_interface__``; TensorFlow: DLPack).
The wrapper records a CUDA event on the producing stream at submission, so the NCCL stream waits
for exactly the work that wrote the tensor, not for later work on that stream. A blocking call's
tensor records none: its caller enqueues nothing until the call returns, so the data is complete
on its stream whenever the collective is dispatched, and a lone in-place allreduce runs on that
very stream (:meth:`DeviceArray.ready_event` records the event only where another stream needs
it). The wrapper also holds the tensor (``owner``) until the collective finished, so its memory
cannot be reused under NCCL.

cupy supplies the device-side objects (views, events, copies). Views need no GPU to build, which
is what lets the pointer plumbing be tested on CPU machines.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..utils import dtypes
from . import completion

DEVICE = "cuda"  # RequestMeta.device of every device tensor; host arrays are "cpu"


def storage_dtype(name: str) -> np.dtype:
    """The dtype cupy holds a core dtype's bytes in (cupy has no bfloat16: its bits as uint16)."""
    return np.dtype(np.uint16) if name == "bfloat16" else dtypes.NUMPY_DTYPE[name]


class DeviceArray:
    """A contiguous tensor in GPU memory, described for the core (never copied by wrapping)."""

    __slots__ = ("ptr", "shape", "dtype", "device_id", "owner", "ready", "current_stream", "stream")
    device = DEVICE

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, device_id: int, owner: Any,
                 ready: Any = None, current_stream: Callable[[int], int] | None = None) -> None:
        self.ptr = int(ptr)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.device_id = int(device_id)
        self.owner = owner  # keeps the memory alive while the core uses it
        self.ready = ready  # a cupy Event recorded where the data was produced, or None if it is complete
        # The framework's "current CUDA stream of the calling thread" (device id -> stream pointer),
        # or None for a framework without streams: how a result's completion is handed over
        # (hvdlite.gpu.completion).
        self.current_stream = current_stream
        self.stream: int | None = None  # the framework stream it was submitted from (None: unknown)

    @classmethod
    def of_framework(cls, ptr: int, shape: tuple[int, ...], dtype: np.dtype, device_id: int, owner: Any,
                     stream: int | None, current_stream: Callable[[int], int] | None,
                     record: bool = True) -> DeviceArray:
        """Like the constructor, for arguments already of the right types (an adapter's hot path:
        one per tensor per collective); records the ready event on ``stream`` unless ``record`` is
        False (a blocking call's tensor: see :attr:`on_its_stream`)."""
        array = cls.__new__(cls)
        array.ptr, array.shape, array.dtype, array.device_id, array.owner = ptr, shape, dtype, device_id, owner
        array.ready = record_ready(stream, device_id) if record else None
        array.current_stream, array.stream = current_stream, stream
        return array

    @classmethod
    def of_blocking_call(cls, ptr: int, shape: tuple[int, ...], dtype: np.dtype, device_id: int, owner: Any,
                         stream: int, current_stream: Callable[[int], int] | None) -> DeviceArray:
        """:meth:`of_framework` with ``record=False``, for a blocking call's tensor (:attr:`on_its_stream`),
        without the questions: the small-op path builds one per call."""
        array = cls.__new__(cls)
        array.ptr, array.shape, array.dtype, array.device_id, array.owner = ptr, shape, dtype, device_id, owner
        array.ready, array.current_stream, array.stream = None, current_stream, stream
        return array

    @property
    def on_its_stream(self) -> bool:
        """True for a blocking call's tensor: complete on :attr:`stream` for as long as the call runs
        (its caller waits), so work enqueued there now sees it and needs no ready event."""
        return self.ready is None and self.stream is not None

    def ready_event(self) -> Any:
        """The event another stream waits on before reading this tensor (None: complete already);
        for a tensor :attr:`on_its_stream`, recorded now."""
        if self.on_its_stream:
            self.ready = record_ready(self.stream, self.device_id)
        return self.ready

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def overlaps(self, other: DeviceArray) -> bool:
        """True if the two byte ranges intersect on the same device."""
        return (self.device_id == other.device_id and self.ptr < other.ptr + other.nbytes
                and other.ptr < self.ptr + self.nbytes)

    def __repr__(self) -> str:
        return f"DeviceArray({self.dtype.name}{list(self.shape)} on cuda:{self.device_id} at {self.ptr:#x})"


def cupy_view(array: DeviceArray, start: int = 0, count: int | None = None) -> Any:
    """A flat cupy array over ``count`` elements of ``array`` from element ``start`` (no copy, no GPU call).

    If ``owner`` is the very cupy array at this address, the view keeps it alive through cupy's
    own memory object; otherwise through ``UnownedMemory``'s owner reference.
    """
    import cupy
    from cupy.cuda import memory

    name = dtypes.NAME_OF[array.dtype]
    count = array.size - start if count is None else count
    if start < 0 or count < 0 or start + count > array.size:
        raise ValueError(f"elements [{start}, {start + count}) are outside {array!r}")
    itemsize = array.dtype.itemsize
    owner = array.owner
    if isinstance(owner, cupy.ndarray) and owner.data.ptr == array.ptr:
        base = owner.data
    else:
        base = memory.MemoryPointer(
            memory.UnownedMemory(array.ptr, max(array.nbytes, 1), owner, device_id=array.device_id), 0)
    return cupy.ndarray((count,), dtype=storage_dtype(name), memptr=base + start * itemsize)


def from_cupy(values: Any, dtype_name: str, shape: tuple[int, ...] | None = None) -> DeviceArray:
    """A core result in a cupy array (holding ``dtype_name``'s bytes) as a :class:`DeviceArray`."""
    shape = tuple(values.shape) if shape is None else shape
    return DeviceArray(values.data.ptr, shape, dtypes.NUMPY_DTYPE[dtype_name], values.device.id, values)


def record_ready(stream_ptr: int | None, device_id: int) -> Any:
    """An event recorded now on the framework's stream ``stream_ptr`` (None: nothing to wait for)."""
    if stream_ptr is None:
        return None
    return completion.record(completion.new_event(device_id), stream_ptr)


@functools.cache
def device_count() -> int:
    """CUDA devices this process sees through cupy; 0 without cupy, a driver, or a GPU.

    Asked once per process: adapters ask for every device tensor, and the answer does not change.
    """
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # ImportError, or CUDARuntimeError without a driver
        return 0
