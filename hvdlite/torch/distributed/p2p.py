"""send / recv of the hvdlite process group: MPI point-to-point on the group's own communicator.

The core has no point-to-point operations (everything it runs is negotiated among all ranks of a
set), so torch's ``send`` / ``recv`` / ``batch_isend_irecv`` go straight to MPI, on a duplicate of
the set's communicator that nothing else uses. Bytes travel as they are (any dtype, bfloat16
included). A wait polls, so that Ctrl-C is seen and a peer that never answers ends the wait with
an error naming it after hvdlite's communication timeout (``HVDLITE_COMM_TIMEOUT``), if one is set.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ...errors import HvdliteError

_POLL_SECONDS = 0.0005


def _as_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A contiguous CPU copy of ``tensor``'s bytes (the view MPI sends from)."""
    host = tensor.detach().contiguous().cpu()
    return host.view(-1).view(torch.uint8).numpy() if host.numel() else np.empty(0, np.uint8)


class PointToPoint:
    """MPI sends and receives on ``comm`` (the group's ranks, in the group's order)."""

    def __init__(self, comm: Any, timeout: float | None) -> None:
        self._comm = comm
        self._timeout = timeout

    def send(self, tensors: list[torch.Tensor], peer: int, tag: int) -> dist.Work:
        buffers = [_as_bytes(t) for t in tensors]
        requests = [self._comm.Isend(buffer, dest=peer, tag=tag) for buffer in buffers]
        return RequestWork(requests, lambda: tensors, f"send to group rank {peer} (tag {tag})", self._timeout,
                           keep=buffers)

    def recv(self, tensors: list[torch.Tensor], peer: int, tag: int) -> dist.Work:
        buffers = [np.empty(t.numel() * t.element_size(), np.uint8) for t in tensors]
        requests = [self._comm.Irecv(buffer, source=peer, tag=tag) for buffer in buffers]

        def finish() -> list[torch.Tensor]:
            with torch.no_grad():
                for tensor, buffer in zip(tensors, buffers, strict=True):
                    received = torch.from_numpy(buffer).view(tensor.dtype).view(tensor.shape)
                    tensor.copy_(received)
            return tensors
        return RequestWork(requests, finish, f"recv from group rank {peer} (tag {tag})", self._timeout)

    def close(self) -> None:
        self._comm.Free()


class RequestWork(dist.Work):
    """c10d work over MPI requests; ``finish`` runs once they completed (it writes received data)."""

    def __init__(self, requests: list[Any], finish: Any, what: str, timeout: float | None, keep: Any = None) -> None:
        super().__init__()
        self._requests, self._finish, self._what, self._timeout = requests, finish, what, timeout
        self._keep = keep  # the send buffers, alive until MPI is done with them
        self._lock = threading.Lock()
        self._value: Any = None
        self._done = False

    def _poll_until_done(self) -> None:
        from mpi4py import MPI

        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while not MPI.Request.Testall(self._requests):
            if deadline is not None and time.monotonic() > deadline:
                raise HvdliteError(f"{self._what}: the peer did not answer within {self._timeout} s "
                                   "(HVDLITE_COMM_TIMEOUT)")
            time.sleep(_POLL_SECONDS)

    def wait(self, timeout: timedelta | None = None) -> bool:
        with self._lock:
            if not self._done:
                self._poll_until_done()
                self._value, self._keep, self._done = self._finish(), None, True
        return True

    def is_completed(self) -> bool:
        from mpi4py import MPI

        return self._done or MPI.Request.Testall(self._requests)

    def result(self) -> Any:
        self.wait()
        return self._value

    def get_future(self) -> torch.futures.Future:
        """Completed by a helper thread that waits (point-to-point work is rarely chained)."""
        future: torch.futures.Future = torch.futures.Future()

        def complete() -> None:
            try:
                self.wait()
                future.set_result(self._value)
            except BaseException as error:  # noqa: BLE001 - handed to the future
                future.set_exception(error)
        threading.Thread(target=complete, daemon=True, name="hvdlite-p2p-future").start()
        return future
