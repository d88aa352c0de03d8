"""torch tensor <-> core NumPy buffer conversion, without copies where torch allows.

A contiguous CPU tensor shares its memory with the array the core sees (``Tensor.numpy()``),
and results come back through ``torch.from_numpy`` without a copy. bfloat16, which NumPy does
not know, travels as an int16 view re-labelled as ``ml_dtypes.bfloat16``.

A CUDA tensor becomes a :class:`~hvdlite.gpu.arrays.DeviceArray` over its own memory, with an
event recorded on torch's current stream, when hvdlite's GPU plane is installed (``hvdlite[gpu]``);
results come back through DLPack without a copy. Without it, CUDA tensors are staged through
host memory here, in the adapter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...core.runtime import caller_waits
from ...errors import UnsupportedOperationError
from ...gpu import arrays as gpu_arrays
from ...utils import dtypes
from ...utils.loaded import is_instance

_TORCH_TO_CORE: dict[torch.dtype, str] = {
    torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16", torch.int32: "int32",
    torch.int64: "int64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.float32: "float32", torch.float64: "float64", torch.bool: "bool",
}
_CORE_TO_TORCH = {name: dtype for dtype, name in _TORCH_TO_CORE.items()}


def core_dtype(tensor: torch.Tensor) -> str:
    """The core's name for ``tensor``'s dtype (its torch name if the core lacks it, to be rejected there)."""
    return _TORCH_TO_CORE.get(tensor.dtype, str(tensor.dtype).removeprefix("torch."))


def cast(tensor: torch.Tensor, dtype_name: str) -> torch.Tensor:
    """``tensor`` converted to the core dtype ``dtype_name``."""
    return tensor.to(_CORE_TO_TORCH[dtype_name])


def _raw_stream_of_public_api(device_id: int) -> int:
    return torch.cuda.current_stream(device_id).cuda_stream


# current_stream(device_id): the calling thread's current torch CUDA stream on ``device_id``, as a raw
# pointer. torch's C binding itself where torch has it, without a Python wrapper: it runs for every
# GPU tensor submitted and every handle waited on (building a ``torch.cuda.Stream`` object costs
# several times more).
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _raw_stream_of_public_api


# The NumPy dtype the core holds each torch dtype in; bfloat16's is added on its first use (ml_dtypes
# loads then: :func:`_numpy_dtype`). Looked up with ``.get`` first on the GPU paths, which run per call.
_NUMPY_DTYPE = {dtype: dtypes.NUMPY_DTYPE[name] for dtype, name in _TORCH_TO_CORE.items() if name != "bfloat16"}


def _numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The NumPy dtype the core holds ``dtype`` in; None for one it does not move."""
    if dtype is torch.bfloat16 and dtype not in _NUMPY_DTYPE:
        _NUMPY_DTYPE[dtype] = dtypes.NUMPY_DTYPE["bfloat16"]
    return _NUMPY_DTYPE.get(dtype)


def own_device_array(tensor: torch.Tensor) -> gpu_arrays.DeviceArray | None:
    """For a blocking call, whose caller waits (so no ready event is recorded): a CUDA tensor's own
    memory as a device array, or None where the core cannot reduce that memory in place (not
    contiguous, needing its autograd graph kept apart, a dtype the GPU plane does not move, no GPU)."""
    dtype = _NUMPY_DTYPE.get(tensor.dtype)
    if dtype is None:
        dtype = _numpy_dtype(tensor.dtype)
    if (dtype is None or tensor.requires_grad or tensor.layout is not torch.strided or not tensor.is_contiguous()
            or gpu_arrays.device_count() == 0):
        return None
    device_id = tensor.get_device()
    return gpu_arrays.DeviceArray.of_blocking_call(tensor.data_ptr(), tuple(tensor.shape), dtype, device_id, tensor,
                                                   current_stream(device_id), current_stream)


def _device_array(tensor: torch.Tensor, dtype: np.dtype) -> gpu_arrays.DeviceArray:
    """A CUDA tensor's own memory (its ``owner`` is ``tensor`` itself unless a contiguous or
    detached tensor had to stand in for it)."""
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.requires_grad:  # held until the collective finished: without its autograd graph
        tensor = tensor.detach()
    device_id = tensor.get_device()
    return gpu_arrays.DeviceArray.of_framework(tensor.data_ptr(), tuple(tensor.shape), dtype, device_id, tensor,
                                               current_stream(device_id), current_stream, record=not caller_waits())


def require_tensor(tensor: Any, name: str | None) -> None:
    """A TypeError naming the collective's tensor unless it is a ``torch.Tensor`` (a NumPy array or a
    list goes to ``hvdlite``'s own collectives, not to the torch adapter's)."""
    if not isinstance(tensor, torch.Tensor):
        which = f"tensor {name!r}" if name else "the tensor"
        raise TypeError(f"{which} must be a torch.Tensor, got {type(tensor).__name__} (hvdlite.torch's collectives take "
                        "torch tensors; NumPy arrays go to hvdlite's own: import hvdlite)")


def to_numpy(tensor: torch.Tensor, name: str | None = None) -> np.ndarray | gpu_arrays.DeviceArray:
    """``tensor``'s data for the core: a host view when it is contiguous on the CPU, its device memory
    (a :class:`DeviceArray`) on a GPU the GPU plane can use, else a host copy."""
    require_tensor(tensor, name)
    if is_instance(tensor, "torch.distributed.tensor", "DTensor"):  # its data pointer is not its data
        raise UnsupportedOperationError(
            f"tensor {name or f'of shape {tuple(tensor.shape)}'!r} is a DTensor (placements {tensor.placements}, "
            f"mesh ranks {tensor.device_mesh.mesh.tolist()}): each rank holds only its part of it, and hvdlite's "
            "collectives take whole tensors. For hvd.fully_shard's parameters use hvd.full_state_dict / "
            "hvd.load_full_state_dict (or torch's get_model_state_dict / set_model_state_dict); pass "
            "tensor.to_local() to reduce this rank's part itself")
    # A dense CUDA tensor of a supported dtype, first and with the fewest questions to torch (each
    # costs ~0.1 us): every GPU collective comes through here. Anything else meets the checks below.
    if tensor.is_cuda and gpu_arrays.device_count() > 0:
        dtype = _NUMPY_DTYPE.get(tensor.dtype)
        if dtype is None:
            dtype = _numpy_dtype(tensor.dtype)
        if dtype is not None and tensor.layout is torch.strided:
            return _device_array(tensor, dtype)
    if tensor.dtype not in _TORCH_TO_CORE:
        supported = ", ".join(map(str, _TORCH_TO_CORE))
        raise UnsupportedOperationError(
            f"tensor {name or f'of shape {tuple(tensor.shape)}'!r} has dtype {tensor.dtype}, which hvdlite does "
            f"not support; supported: {supported}")
    if tensor.is_sparse:
        raise UnsupportedOperationError(
            f"tensor {name or ''!r} is sparse; collectives take dense tensors (the optimizer handles sparse "
            "gradients: see sparse_as_dense)")
    host = tensor.detach()
    if host.device.type != "cpu":
        host = host.cpu()
    host = host.contiguous()
    if host.dtype is torch.bfloat16:
        return host.view(torch.int16).numpy().view(dtypes.bfloat16)
    return host.numpy()


def from_numpy(array: np.ndarray | gpu_arrays.DeviceArray, like: torch.Tensor | None = None) -> torch.Tensor:
    """A tensor sharing ``array``'s memory (host or device), moved to ``like``'s device if it is elsewhere."""
    if isinstance(array, gpu_arrays.DeviceArray):
        tensor = torch.from_dlpack(gpu_arrays.cupy_view(array))
        if dtypes.is_bfloat16(array.dtype):
            tensor = tensor.view(torch.bfloat16)  # cupy holds bfloat16 as its uint16 bits
        return tensor.view(array.shape)
    if dtypes.is_bfloat16(array.dtype):
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array)
    if like is not None and like.device.type != "cpu":
        tensor = tensor.to(like.device)
    return tensor


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # not subclasses that hold other data (DTensor)
_NATIVE = frozenset(dtype for dtype in _TORCH_TO_CORE if dtype is not torch.bfloat16)  # NumPy holds these


def plain_host_view(tensor: torch.Tensor) -> np.ndarray | None:
    """A NumPy view of ``tensor``'s memory when it is a plain, dense, contiguous CPU tensor of a
    dtype NumPy holds (what :func:`to_numpy` gives it, with a fraction of its questions to torch),
    else None: then :func:`to_numpy`, which converts or explains. For per-call paths."""
    if (tensor.__class__ in _PLAIN_TENSORS and tensor.is_cpu and tensor.dtype in _NATIVE
            and tensor.layout is torch.strided and tensor.is_contiguous()):
        return (tensor.detach() if tensor.requires_grad else tensor).numpy()
    return None


def host_view(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view of a contiguous CPU tensor's memory, without :func:`to_numpy`'s checks."""
    host = tensor.detach()
    if host.dtype is torch.bfloat16:
        return host.view(torch.int16).numpy().view(dtypes.bfloat16)
    return host.numpy()


def is_aliased(tensor: torch.Tensor) -> bool:
    """True if :func:`to_numpy` gives a view of ``tensor`` (writing the array writes the tensor)."""
    if not tensor.is_contiguous():
        return False
    if tensor.is_cuda:  # asked first: building tensor.device costs more (this runs per in-place collective)
        return gpu_arrays.device_count() > 0
    return tensor.device.type == "cpu"
