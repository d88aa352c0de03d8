"""Lifecycle and topology queries (Horovod's ``basics``)."""

from __future__ import annotations

from .core.runtime import current, is_initialized, mpi_threads_supported


def rank() -> int:
    """This process's rank in the job."""
    return current().topology.rank


def size() -> int:
    """Number of ranks in the job."""
    return current().topology.size


def local_rank() -> int:
    """This process's index among the ranks on its host."""
    return current().topology.local_rank


def local_size() -> int:
    """Number of ranks on this process's host."""
    return current().topology.local_size


def cross_rank() -> int:
    """This process's index among the ranks (one per host) that share its local rank."""
    return current().topology.cross_rank


def cross_size() -> int:
    """Number of hosts that have a rank with this process's local rank."""
    return current().topology.cross_size


def is_homogeneous() -> bool:
    """True if every host runs the same number of ranks."""
    return current().topology.is_homogeneous


def mpi_enabled() -> bool:
    """True once hvdlite runs on MPI (always, after ``init()``)."""
    return is_initialized()


def mpi_built() -> bool:
    """hvdlite always carries its MPI transport (mpi4py)."""
    return True


def nccl_built() -> int:
    """The version of the NCCL library hvdlite loads (2.32.3 -> 23203), or 0 without ``hvdlite[gpu]``.

    An int, as Horovod returns. Loading NCCL needs no GPU; using it does.
    """
    from .gpu import nccl

    return nccl.version() if nccl.available() else 0


def cuda_built() -> bool:
    """True when hvdlite's GPU data plane can run: NCCL is loadable (``hvdlite[gpu]``)."""
    return nccl_built() > 0


def rocm_built() -> bool:
    """hvdlite has no ROCm plane."""
    return False


def ddl_built() -> bool:
    """hvdlite has no IBM DDL plane."""
    return False


def ccl_built() -> bool:
    """hvdlite has no oneCCL plane."""
    return False


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    """hvdlite has no Gloo transport."""
    return False


__all__ = [
    "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "is_homogeneous",
    "mpi_enabled", "mpi_built", "nccl_built", "gloo_enabled", "gloo_built", "is_initialized",
    "mpi_threads_supported", "cuda_built", "rocm_built", "ddl_built", "ccl_built",
]
