"""GPU Adasum's MPI side on real ranks, without a GPU, with simulated host names.

Usage: gpu_adasum_hosts.py (np=3: hosts a, a, b; np=4: a, b, a, c, three hosts of uneven size).
Checks hvdlite.core.planes.hierarchical.average_then_adasum (the host-staged plane's GPU Adasum) against
hvdlite.core.transport.adasum_math.reference of each host's average (hosts in order of first appearance, as the cross-host
group orders its local roots), every rank with the same bits, in float32 and float64; and
cross_host_adasum (the NCCL plane's step on the local roots) on bfloat16 storage. Prints "ok <check>".
"""

import ml_dtypes
import numpy as np
from mpi4py import MPI

import hvdlite as hvd
from hvdlite.core.planes.hierarchical import average_then_adasum, build_groups, cross_host_adasum
from hvdlite.core.transport import adasum_math as adasum

LENGTH = 37  # odd: the halving splits unevenly


def vector(rank: int, dtype: type) -> np.ndarray:
    return np.random.default_rng(rank).normal(size=LENGTH).astype(dtype)


def host_averages(hosts: list[str], dtype: type) -> list[np.ndarray]:
    """Each host's average of its ranks' vectors (float64), hosts in order of first appearance."""
    order = list(dict.fromkeys(hosts))
    return [np.mean([vector(r, dtype).astype(np.float64) for r, h in enumerate(hosts) if h == host], axis=0)
            for host in order]


def check_same_everywhere(comm: MPI.Comm, values: np.ndarray, what: str) -> None:
    everyone = comm.allgather(values.tobytes())
    assert len(set(everyone)) == 1, f"{what}: the ranks' results differ"


def main() -> None:
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    hosts = {3: ["a", "a", "b"], 4: ["a", "b", "a", "c"]}[size]
    groups = build_groups(comm.Dup(), hosts, rank, 4 << 20, 0.001, 60)
    for dtype, tolerance in ((np.float32, 1e-5), (np.float64, 1e-12)):
        buffer = vector(rank, dtype)
        average_then_adasum(groups, buffer)
        want = adasum.reference(host_averages(hosts, dtype))
        np.testing.assert_allclose(buffer, want, rtol=0, atol=tolerance * np.abs(want).max())
        check_same_everywhere(comm, buffer, dtype.__name__)
        print(f"ok average then adasum {dtype.__name__}", flush=True)
    if groups.cross is not None:  # the local roots: each host's average arrives in bfloat16 bits
        averages = host_averages(hosts, np.float32)
        mine = averages[list(dict.fromkeys(hosts)).index(hosts[rank])].astype(ml_dtypes.bfloat16)
        result = cross_host_adasum(groups.cross, mine.view(np.uint16).copy(), "bfloat16")
        rounded = [a.astype(ml_dtypes.bfloat16).astype(np.float64) for a in averages]
        want = adasum.reference(rounded).astype(ml_dtypes.bfloat16).astype(np.float64)
        got = result.view(ml_dtypes.bfloat16).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=0, atol=2 ** -7 * np.abs(want).max())
    print("ok cross host adasum bfloat16", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
