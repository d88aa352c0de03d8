import os
def cgt():
    for l in open(f"/proc/{os.getpid()}/status"):
        if l.startswith("SigCgt"): return (int(l.split()[1],16) >> 9) & 1
print("before init SIGUSR1 caught:", cgt())
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
print("after init SIGUSR1 caught:", cgt(), flush=True)
