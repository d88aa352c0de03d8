"""The GPU plane's collective setup on real ranks, without a GPU: the NCCL unique id exchange, the
job-wide plane choice, and a device/host mismatch caught by negotiation before any device use.

Prints one line per check; the test compares them across ranks.
"""

import hashlib

import ml_dtypes
import numpy as np
from mpi4py import MPI

import hvdlite as hvd
from hvdlite import errors
from hvdlite.core.planes.device import exchange_rows, exchange_unique_id
from hvdlite.core.planes.hierarchical import build_groups, cross_host_allreduce
from hvdlite.core.transport.mpi import MpiTransport
from hvdlite.gpu import selection
from hvdlite.gpu.arrays import DeviceArray
from hvdlite.ops import ReduceOp


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    backend = MpiTransport(MPI.COMM_WORLD.Dup(), 4 << 20, 0.001, timeout=60)

    uid = exchange_unique_id(backend, rank)
    print(f"uid {len(uid)} {hashlib.sha256(uid).hexdigest()}", flush=True)

    own_gpus = exchange_rows(backend, selection.RankGpu(23203, False, False,
                                                        selection.gpu_key("host", f"0000:{rank:02x}:00.0")), size)
    print(f"own {selection.choose_plane(own_gpus)}", flush=True)
    one_gpu = exchange_rows(backend, selection.RankGpu(23203, False, False, selection.gpu_key("host", "0")), size)
    print(f"shared {selection.choose_plane(one_gpu)}", flush=True)

    # Rank 0 holds the tensor in host memory, the others claim device memory (never touched: the
    # mismatch is found in negotiation, before execution).
    shape = (5, 3)
    tensor = np.ones(shape, ml_dtypes.bfloat16) if rank == 0 else DeviceArray(0x1000, shape, ml_dtypes.bfloat16,
                                                                                   0, owner=None)
    try:
        hvd.allreduce(tensor, name="mixed")
        print("mixed: no error", flush=True)
    except errors.TensorMismatchError as exc:
        print(f"mixed: {exc}", flush=True)
    # The job goes on after the error: a normal host allreduce still works.
    print(f"after {hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum, name='after').tolist()}", flush=True)

    # The hierarchical allreduce's MPI side, with simulated hosts: a, a, b at np=3; a, b at np=2.
    hosts = ["a", "a", "b"] if size == 3 else ["a", "b"]
    groups = build_groups(MPI.COMM_WORLD.Dup(), hosts, rank, 4 << 20, 0.001, 60)
    local_uid = exchange_unique_id(groups.local, groups.local_rank)
    print(f"hier {hosts[rank]} {groups.local_rank}/{groups.local_size} of {groups.hosts} hosts "
          f"{hashlib.sha256(local_uid).hexdigest()[:16]}", flush=True)
    if groups.cross is not None:
        bits = np.array([1.5, rank + 0.25, -3.0], ml_dtypes.bfloat16).view(np.uint16)
        summed = cross_host_allreduce(groups.cross, bits.copy(), "bfloat16", ReduceOp.SUM)
        print(f"cross {summed.view(ml_dtypes.bfloat16).astype(np.float32).tolist()}", flush=True)
        biggest = cross_host_allreduce(groups.cross, np.array([rank, 1], np.int64), "int64", ReduceOp.MAX)
        print(f"cross_max {biggest.tolist()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
