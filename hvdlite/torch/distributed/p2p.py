"""send / recv of the hvdlite process group: MPI point-to-point on the group's own communicator.

The core has no point-to-point operations (everything it runs is negotiated among all ranks of a
set), so torch's ``send`` / ``recv`` / ``batch_isend_irecv`` go straight to MPI, on a duplicate of
the set's communicator that nothing else uses. Bytes travel as they are (any dtype, bfloat16
included). A receive is posted when it is called (so sends and receives in any order progress), and
checked when it completes: a message of another size than the tensor is an error naming both, as is
a peer outside the group. A wait polls, so that Ctrl-C is seen and a peer that never answers ends
the wait with an error naming it after the group's timeout.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ...errors import HvdliteError, TensorMismatchError
from .checks import check_peer

_POLL_SECONDS = 0.0005
ANY_SOURCE = -1  # torch's recv_anysource: the sender is known once the message came


def _as_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A contiguous CPU copy of ``tensor``'s bytes (the view MPI sends from)."""
    host = tensor.detach().contiguous().cpu()
    return host.view(-1).view(torch.uint8).numpy() if host.numel() else np.empty(0, np.uint8)


def _described(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}".replace(" ", "")


class PointToPoint:
    """MPI sends and receives on ``comm`` (the group's ranks, in the group's order); ``group``
    names the group in errors."""

    def __init__(self, comm: Any, timeout: float | None, group: str) -> None:
        self._comm = comm
        self.timeout = timeout
        self._group = group

    @property
    def comm(self) -> Any:
        return self._comm

    def send(self, tensors: list[torch.Tensor], peer: int, tag: int) -> dist.Work:
        what = f"send to group rank {peer} (tag {tag}) on {self._group}"
        check_peer(peer, self._comm.Get_rank(), self._comm.Get_size(), what)
        buffers = [_as_bytes(t) for t in tensors]
        requests = [self._comm.Isend(buffer, dest=peer, tag=tag) for buffer in buffers]
        return RequestWork(requests, lambda statuses: tensors, what, self.timeout, keep=buffers)

    def recv(self, tensors: list[torch.Tensor], peer: int, tag: int) -> dist.Work:
        from mpi4py import MPI

        source = "any rank" if peer == ANY_SOURCE else f"group rank {peer}"
        what = f"recv from {source} (tag {tag}) on {self._group}"
        if peer != ANY_SOURCE:
            check_peer(peer, self._comm.Get_rank(), self._comm.Get_size(), what)
        buffers = [np.empty(t.numel() * t.element_size(), np.uint8) for t in tensors]
        mpi_source = MPI.ANY_SOURCE if peer == ANY_SOURCE else peer
        requests = [self._comm.Irecv(buffer, source=mpi_source, tag=tag) for buffer in buffers]

        def finish(statuses: list[Any]) -> list[torch.Tensor]:
            for tensor, buffer, status in zip(tensors, buffers, statuses, strict=True):
                received = status.Get_count(MPI.BYTE)
                if received != buffer.size:
                    raise TensorMismatchError(
                        f"{what}: the message from group rank {status.Get_source()} has {received} bytes, the "
                        f"tensor {_described(tensor)} {buffer.size}; send and receive tensors of the same size")
                if buffer.size:
                    with torch.no_grad():
                        tensor.copy_(torch.from_numpy(buffer).view(tensor.dtype).view(tensor.shape))
            return tensors
        return RequestWork(requests, finish, what, self.timeout)

    def close(self) -> None:
        self._comm.Free()


class RequestWork(dist.Work):
    """c10d work over MPI requests; ``finish(statuses)`` runs once they completed (it checks and
    writes received data) and gives the future's value."""

    def __init__(self, requests: list[Any], finish: Any, what: str, timeout: float | None, keep: Any = None) -> None:
        from mpi4py import MPI

        super().__init__()
        self._requests, self._finish, self._what, self._timeout = requests, finish, what, timeout
        self._statuses = [MPI.Status() for _ in requests]
        self._keep = keep  # the send buffers, alive until MPI is done with them
        self._lock = threading.Lock()
        self._value: Any = None
        self._error: BaseException | None = None
        self._done = False

    def _poll_until_done(self) -> None:
        from mpi4py import MPI

        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while not MPI.Request.Testall(self._requests, self._statuses):
            if deadline is not None and time.monotonic() > deadline:
                raise HvdliteError(f"{self._what}: the peer did not answer within {self._timeout:g} s (the "
                                   "group's timeout, or HVDLITE_COMM_TIMEOUT_SECONDS if shorter)")
            time.sleep(_POLL_SECONDS)

    def _complete(self) -> None:
        from mpi4py import MPI

        try:
            self._poll_until_done()
            self._value = self._finish(self._statuses)
        except MPI.Exception as error:  # a message longer than the tensor (MPI_ERR_TRUNCATE), mostly
            self._error = TensorMismatchError(f"{self._what}: {error.Get_error_string().splitlines()[0]}; send and "
                                              "receive tensors of the same size")
        except HvdliteError as error:
            self._error = error
        self._keep, self._done = None, True

    def wait(self, timeout: timedelta | None = None) -> bool:
        with self._lock:
            if not self._done:
                self._complete()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        from mpi4py import MPI

        return self._done or MPI.Request.Testall(self._requests)

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> Any:
        self.wait()
        return self._value

    def _source_rank(self) -> int:
        """The sender of a receive from any rank (torch's ``recv(src=None)`` returns it)."""
        self.wait()
        return self._statuses[0].Get_source()

    source_rank = _source_rank

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
