"""A ctypes binding to the NCCL library that ``nvidia-nccl-cu12`` or ``-cu13`` installs (``libnccl.so.2``).

Why ctypes on the wheel's library rather than ``cupy.cuda.nccl``: hvdlite needs calls cupy does
not wrap (``ncclRedOpCreatePreMulSum``, which folds the pre/post-scale factors and the division
of an Average into the reduction kernel for every dtype, bfloat16 included; ``ncclCommAbort``
and ``ncclCommGetAsyncError`` on hvdlite's own deadline), and it pins the NCCL it talks to: the
wheel's, whose version :func:`version` reports. cupy still provides device memory, streams and
events (:mod:`hvdlite.gpu.arrays`).

Loading the library and creating a unique id need no GPU (both are tested on CPU machines);
creating a communicator and every collective do.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from ..errors import CommTimeoutError, DeviceError
from ..ops import ReduceOp
from ..utils import dtypes
from . import stack

UNIQUE_ID_BYTES = 128  # sizeof(ncclUniqueId)

# ncclDataType_t (nccl.h). NCCL has no 16-bit integer: int16 travels widened to int32.
NCCL_DTYPE: dict[str, int] = {
    "int8": 0, "uint8": 1, "int32": 2, "int64": 4, "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9,
}
# ncclRedOp_t (nccl.h); Average on integers is ncclAvg (sum, then integer division by the size).
NCCL_OP: dict[ReduceOp, int] = {
    ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3, ReduceOp.AVERAGE: 4,
}
_SCALAR_HOST_IMMEDIATE = 1  # ncclScalarResidence_t: the scalar is read from host memory at call time
_IN_PROGRESS = 7  # ncclInProgress
_MAX_PREMUL_OPS = 64  # pre-multiplied sums kept per communicator (one per dtype and factor in use)
_SCALAR_DTYPES = frozenset(("float16", "bfloat16", "float32", "float64"))  # ncclRedOpCreatePreMulSum's scalars


class NcclError(DeviceError):
    """An NCCL call failed; the message names the call and NCCL's own explanation."""


class NcclUnavailableError(NcclError):
    """The NCCL library is not installed or cannot be loaded (install ``hvdlite[gpu]``)."""


def library_path() -> str | None:
    """Where the NCCL wheel chosen for this CUDA stack put ``libnccl.so.2`` (:func:`.stack.choose_nccl`:
    ``nvidia-nccl-cu12`` or ``-cu13``), or None if no NCCL wheel is installed."""
    chosen = stack.choose_nccl(stack.installed(stack.NCCL_WHEELS), stack.installed(stack.CUPY_WHEELS))
    found = stack.library_in(chosen) if chosen is not None else None
    if found is not None or chosen is None:
        return found
    # A wheel whose record lists no files (installed by other means): its package's usual place.
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") else None
    for root in spec.submodule_search_locations if spec is not None and spec.submodule_search_locations else ():
        path = os.path.join(root, "lib", "libnccl.so.2")
        if os.path.exists(path):
            return path
    return None


@functools.cache
def _library() -> ctypes.CDLL:
    path = library_path()
    if path is None:
        raise NcclUnavailableError("NCCL is not installed: pip install 'hvdlite[gpu]' (CUDA 12: nvidia-nccl-cu12) "
                                   "or 'hvdlite[gpu-cu13]' (CUDA 13: nvidia-nccl-cu13)")
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise NcclUnavailableError(f"cannot load NCCL from {path}: {exc}") from None
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetLastError.restype = ctypes.c_char_p
    # Declared, so the per-operation calls pass plain ints without building ctypes objects first.
    pointer, count, enum = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    lib.ncclAllReduce.argtypes = [pointer, pointer, count, enum, enum, pointer, pointer]
    lib.ncclReduce.argtypes = [pointer, pointer, count, enum, enum, ctypes.c_int, pointer, pointer]
    lib.ncclBroadcast.argtypes = [pointer, pointer, count, enum, ctypes.c_int, pointer, pointer]
    return lib


def _check(result: int, call: str, comm: ctypes.c_void_p | None = None) -> None:
    if result in (0, _IN_PROGRESS):
        return
    lib = _library()
    detail = lib.ncclGetLastError(comm).decode(errors="replace") if comm is not None else ""
    reason = lib.ncclGetErrorString(result).decode(errors="replace")
    raise NcclError(f"{call} failed: {reason}" + (f" ({detail})" if detail else ""))


def available() -> bool:
    """True if the NCCL library loads (no GPU needed)."""
    try:
        _library()
    except NcclUnavailableError:
        return False
    return True


def version() -> int:
    """NCCL's version as one integer (2.32.3 -> 23203), as ``ncclGetVersion`` reports it."""
    value = ctypes.c_int()
    _check(_library().ncclGetVersion(ctypes.byref(value)), "ncclGetVersion")
    return value.value


def unique_id() -> bytes:
    """A fresh ``ncclUniqueId``: rank 0 makes one and every rank of the new communicator uses it."""
    buffer = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
    _check(_library().ncclGetUniqueId(buffer), "ncclGetUniqueId")
    return buffer.raw


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]  # passed by value, as nccl.h declares it


def unique_id_struct(uid: bytes) -> _UniqueId:
    """``uid`` as the by-value ``ncclUniqueId``, byte for byte.

    Not ``_UniqueId(uid)`` on a ``c_char`` array: ctypes treats that as a C string and stops at the
    first NUL, and an id starts with a socket address full of zero bytes (the communicator then
    waited forever on a root at 0.0.0.0; found on the first run on a GPU).
    """
    if len(uid) != UNIQUE_ID_BYTES:
        raise NcclError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
    return _UniqueId.from_buffer_copy(uid)


def scalar_bytes(dtype: str, value: float) -> bytes:
    """``value`` encoded in the floating dtype ``dtype`` (for ``ncclRedOpCreatePreMulSum``)."""
    return np.array([value], dtype=dtypes.NUMPY_DTYPE[dtype]).tobytes()


class Communicator:
    """One NCCL communicator (a process set on one device). Calls enqueue on a CUDA stream."""

    def __init__(self, handle: ctypes.c_void_p, size: int, rank: int) -> None:
        self._handle = handle
        self.size = size
        self.rank = rank
        self._aborted = False
        # Pre-multiplied sums by (dtype, factor), made once: an Average at np > 1 uses one on every call.
        self._premul_ops: dict[tuple[str, float], int] = {}
        self._nccl_allreduce = _library().ncclAllReduce  # bound once: every gradient's launch calls it
        self._address = handle.value  # ctypes converts a plain int to a pointer faster than a c_void_p

    @classmethod
    def create(cls, uid: bytes, size: int, rank: int, device_id: int, timeout: float | None) -> Communicator:
        """``ncclCommInitRank`` on CUDA device ``device_id``, bounded by ``timeout`` seconds.

        The call blocks until every rank joined; it runs in a helper thread so that a peer that
        never arrives ends in a :class:`CommTimeoutError` instead of a hang. (The thread selects
        the device itself: CUDA's current device is per thread.)
        """
        by_value = unique_id_struct(uid)
        handle = ctypes.c_void_p()
        outcome: list[BaseException | None] = []

        def init() -> None:
            try:
                import cupy

                cupy.cuda.runtime.setDevice(device_id)
                _check(_library().ncclCommInitRank(ctypes.byref(handle), size, by_value, rank),
                       f"ncclCommInitRank(rank {rank} of {size})")
                outcome.append(None)
            except NcclError as exc:
                outcome.append(exc)
            except Exception as exc:  # CUDA's own errors (no device, no driver), named as this rank's NCCL setup
                outcome.append(NcclError(f"NCCL communicator of {size} ranks on rank {rank}, CUDA device "
                                         f"{device_id}: {type(exc).__name__}: {exc}"))

        worker = threading.Thread(target=init, name="hvdlite-nccl-init", daemon=True)
        worker.start()
        worker.join(timeout)
        if not outcome:
            raise CommTimeoutError(f"NCCL communicator of {size} ranks not created within {timeout:g} s "
                                   f"(rank {rank}); a peer did not arrive")
        if outcome[0] is not None:
            raise outcome[0]
        return cls(handle, size, rank)

    @property
    def aborted(self) -> bool:
        """True once :meth:`abort` (or :meth:`destroy`) ran."""
        return self._aborted

    def async_error(self) -> str:
        """NCCL's asynchronous error for this communicator ('' if none): a failed peer or network."""
        result = ctypes.c_int()
        _check(_library().ncclCommGetAsyncError(self._handle, ctypes.byref(result)), "ncclCommGetAsyncError")
        if result.value in (0, _IN_PROGRESS):
            return ""
        return _library().ncclGetErrorString(result.value).decode(errors="replace")

    def abort(self) -> None:
        """Tear the communicator down without waiting for peers (after a timeout or an error)."""
        if not self._aborted:
            self._aborted = True
            _library().ncclCommAbort(self._handle)

    def destroy(self) -> None:
        if not self._aborted:
            self._aborted = True
            _check(_library().ncclCommDestroy(self._handle), "ncclCommDestroy")

    # ---- collectives: pointers are device addresses, counts are elements of ``dtype`` ------------
    def allreduce(self, send: int, recv: int, count: int, dtype: str, op: ReduceOp, stream: int,
                  scale: float = 1.0) -> None:
        """``recv = op(send over ranks)``; with ``scale`` != 1 (Sum only): ``sum(scale * send)``."""
        nccl_op = NCCL_OP[op] if scale == 1.0 else self._op(dtype, op, scale)
        result = self._nccl_allreduce(send, recv, count, NCCL_DTYPE[dtype], nccl_op, self._address, stream)
        if result:
            _check(result, "ncclAllReduce", self._handle)

    def reduce(self, send: int, recv: int, count: int, dtype: str, op: ReduceOp, root: int, stream: int,
               scale: float = 1.0) -> None:
        _check(_library().ncclReduce(send, recv, count, NCCL_DTYPE[dtype], self._op(dtype, op, scale), root,
                                     self._handle, stream), "ncclReduce", self._handle)

    def broadcast(self, send: int, recv: int, nbytes: int, root: int, stream: int) -> None:
        _check(_library().ncclBroadcast(send, recv, nbytes, NCCL_DTYPE["uint8"], root, self._handle, stream),
               "ncclBroadcast", self._handle)

    def send(self, buffer: int, nbytes: int, peer: int, stream: int) -> None:
        _check(_library().ncclSend(ctypes.c_void_p(buffer), ctypes.c_size_t(nbytes), NCCL_DTYPE["uint8"], peer,
                                   self._handle, ctypes.c_void_p(stream)), "ncclSend", self._handle)

    def recv(self, buffer: int, nbytes: int, peer: int, stream: int) -> None:
        _check(_library().ncclRecv(ctypes.c_void_p(buffer), ctypes.c_size_t(nbytes), NCCL_DTYPE["uint8"], peer,
                                   self._handle, ctypes.c_void_p(stream)), "ncclRecv", self._handle)

    def _op(self, dtype: str, op: ReduceOp, scale: float) -> int:
        """The NCCL op for ``op``; a Sum with a scale factor is a pre-multiplied sum, made once per
        (dtype, factor) and kept (NCCL reads a host scalar when the op is made; the op is reusable)."""
        if scale == 1.0:
            return NCCL_OP[op]
        made = self._premul_ops.get((dtype, scale))
        if made is not None:
            return made
        if op is not ReduceOp.SUM or dtype not in _SCALAR_DTYPES:
            raise NcclError(f"a scaled reduction needs Sum on a floating dtype, got {op.name} on {dtype}")
        if len(self._premul_ops) >= _MAX_PREMUL_OPS:  # drop the oldest; NCCL allows it once its calls returned
            oldest = next(iter(self._premul_ops))
            _library().ncclRedOpDestroy(self._premul_ops.pop(oldest), self._handle)
        created = ctypes.c_int()
        scalar = ctypes.create_string_buffer(scalar_bytes(dtype, scale))
        _check(_library().ncclRedOpCreatePreMulSum(ctypes.byref(created), scalar, NCCL_DTYPE[dtype],
                                                   _SCALAR_HOST_IMMEDIATE, self._handle),
               "ncclRedOpCreatePreMulSum", self._handle)
        self._premul_ops[(dtype, scale)] = created.value
        return created.value


@contextmanager
def group() -> Iterator[None]:
    """``ncclGroupStart`` / ``ncclGroupEnd``: the calls inside launch together (send/recv pairs, v-collectives)."""
    _check(_library().ncclGroupStart(), "ncclGroupStart")
    try:
        yield
    finally:
        _check(_library().ncclGroupEnd(), "ncclGroupEnd")
