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


def _sees_a_gpu(framework: str) -> bool:
    """Whether ``framework`` (imported here) has a CUDA device to put tensors on."""
    if framework == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    if framework == "torch":
        import torch

        return torch.cuda.is_available()
    import jax

    return any(device.platform == "gpu" for device in jax.devices())


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Horovod's ``gpu_available``: True if hvdlite reduces ``ext_base_name``'s GPU tensors here
    ('tensorflow', 'torch' or 'jax'): its GPU plane is installed (``hvdlite[gpu]``, see
    :func:`cuda_built`) and the framework sees a CUDA device. Horovod answers from how it was
    compiled; hvdlite from this machine, so a test that skips its GPU cases on False skips them where
    they cannot run. ``verbose`` prints why not."""
    if ext_base_name not in ("tensorflow", "torch", "jax"):
        reason = f"hvdlite has no {ext_base_name!r} adapter (it has 'tensorflow', 'torch' and 'jax')"
    elif not cuda_built():
        reason = "hvdlite's GPU plane is not installed (pip install 'hvdlite[gpu]')"
    elif not _sees_a_gpu(ext_base_name):
        reason = f"{ext_base_name} sees no CUDA device"
    else:
        return True
    if verbose:
        print(f"hvdlite: GPU not available for {ext_base_name}: {reason}", flush=True)
    return False


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
    "mpi_threads_supported", "cuda_built", "gpu_available", "rocm_built", "ddl_built", "ccl_built",
]
