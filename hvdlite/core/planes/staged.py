"""The host-staged data plane: device -> host, the MPI path, host -> device.

Used when NCCL cannot run the job (not installed, several ranks on one GPU without NCCL's
multi-rank mode, or ``HVDLITE_GPU_OPERATIONS=MPI``). Each input is copied to host memory on the
plane's stream after its ready event, the host executor runs the item exactly as it runs CPU
tensors (fusion, widening of 16-bit floats, scaling), and results go back to device memory: into
the caller's output for in-place forms, else into new device arrays.

Adasum is the exception: on GPU tensors it is the Adasum across hosts of each host's average, on
every GPU plane (:func:`~hvdlite.core.planes.hierarchical.average_then_adasum`), not the host path's Adasum
across all ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ...gpu import completion
from ...gpu.arrays import DeviceArray, cupy_view, from_cupy, storage_dtype
from ...ops import Collective, ReduceOp
from ...utils import dtypes
from ..work.request import Request
from ..work.response import Response
from .hierarchical import Groups, average_then_adasum
from .host import HostPlane


class HostStagedPlane:
    """Device tensors through host memory and the host (MPI) executor."""

    name = "MPI (host-staged)"

    def __init__(self, host: HostPlane, device_id: int, host_groups: Callable[[], Groups]) -> None:
        """``host_groups`` makes this rank's host and cross-host groups (collectively, on first use: Adasum)."""
        import cupy

        self._cp = cupy
        self._host = host
        self._device_id = device_id
        self._host_groups = host_groups
        self._groups: Groups | None = None
        with cupy.cuda.Device(device_id):
            self._stream = cupy.cuda.Stream(non_blocking=True)

    def close(self) -> None:
        pass

    def poll(self) -> None:
        pass  # every dispatch returns with its work finished: nothing is left in flight

    def dispatch(self, responses: tuple[Response, ...], local: Mapping[str, Request]) -> list:
        if responses[0].meta.op is ReduceOp.ADASUM:  # never fused: one tensor
            return [self._adasum(responses[0], local.get(responses[0].meta.name))]
        with self._cp.cuda.Device(self._device_id), self._stream:
            staged = {}
            for response in responses:
                request = local.get(response.meta.name)
                if request is not None:
                    host = self._to_host(request.tensor)
                    # An in-place request stays in place on its host copy, which then goes back.
                    output = host if request.output is not None else None
                    staged[response.meta.name] = Request(request.meta, host, request.handle, output,
                                                         request.submitted_at)
            self._stream.synchronize()
        results = self._host.dispatch(responses, staged)
        with self._cp.cuda.Device(self._device_id), self._stream:
            back = [self._to_device(r, result, local.get(r.meta.name)) for r, result in zip(responses, results,
                                                                                            strict=True)]
            self._stream.synchronize()
        return back

    def _adasum(self, response: Response, request: Request | None) -> Any:
        """One tensor's GPU Adasum through host memory; a joined rank contributes zeros."""
        meta = response.meta
        with self._cp.cuda.Device(self._device_id), self._stream:
            source = self._to_host(request.tensor) if request is not None else np.zeros(meta.shape, np.float32)
            self._stream.synchronize()
        buffer = np.array(source, dtype=dtypes.wire_dtype(meta.dtype)).reshape(-1)  # float32 for 16-bit floats
        if self._groups is None:  # collective: every rank reaches its first Adasum item together
            self._groups = self._host_groups()
        average_then_adasum(self._groups, buffer)
        result = buffer.astype(dtypes.NUMPY_DTYPE[meta.dtype]).reshape(meta.shape)
        with self._cp.cuda.Device(self._device_id), self._stream:
            delivered = self._to_device(response, result, request)
            self._stream.synchronize()
        return delivered

    def _to_host(self, array: DeviceArray) -> np.ndarray:
        ready = array.ready_event()
        if ready is not None:
            completion.stream_waits(self._stream.ptr, ready)
        host = cupy_view(array).get(stream=self._stream)
        return host.view(array.dtype).reshape(array.shape)

    def _to_device(self, response: Response, result: Any, request: Request | None) -> Any:
        if request is None:  # a joined rank's share of an allreduce: nobody waits for it
            return result
        if response.meta.collective is Collective.ALLTOALL:
            data, received = result
            return self._to_device_array(data), received
        if request.output is not None:
            cupy_view(request.output).set(np.ascontiguousarray(result).reshape(-1).view(
                storage_dtype(response.meta.dtype)), stream=self._stream)
            return request.output
        return self._to_device_array(result)

    def _to_device_array(self, values: np.ndarray) -> DeviceArray:
        name = dtypes.NAME_OF[values.dtype]
        flat = np.ascontiguousarray(values).reshape(-1).view(storage_dtype(name))
        return from_cupy(self._cp.asarray(flat), name, values.shape)
