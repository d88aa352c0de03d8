"""ctypes access to MPICH's MPIX_Comm_get_failed (mpi4py's mpich build does not bind MPIX_*: its
Comm.Get_failed/Shrink/Agree are fallbacks; Get_failed returns an empty group)."""
import ctypes

from mpi4py import MPI


def _libmpi():
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if "libmpi.so" in path or "libmpi_abi.so" in path:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    raise RuntimeError("libmpi not loaded")


_lib = _libmpi()
_HANDLE = ctypes.c_uint if MPI.COMM_WORLD.handle < 2**32 else ctypes.c_void_p


def get_failed(comm):
    """MPIX_Comm_get_failed(comm) -> list of ranks of `comm` that Hydra reports dead (PMI_dead_processes)."""
    grp = _HANDLE()
    err = _lib.MPIX_Comm_get_failed(_HANDLE(comm.handle), ctypes.byref(grp))
    if err:
        raise RuntimeError(f"MPIX_Comm_get_failed -> {err}")
    g = MPI.Group.fromhandle(grp.value)
    n = g.Get_size()
    ranks = MPI.Group.Translate_ranks(g, list(range(n)), comm.Get_group()) if n else []
    return sorted(ranks)


def shrink(comm):
    """MPIX_Comm_shrink(comm) -> new mpi4py Comm without the failed processes."""
    new = _HANDLE()
    err = _lib.MPIX_Comm_shrink(_HANDLE(comm.handle), ctypes.byref(new))
    if err:
        raise RuntimeError(f"MPIX_Comm_shrink -> {err}")
    return MPI.Intracomm.fromhandle(new.value)
