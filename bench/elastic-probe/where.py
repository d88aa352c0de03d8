import os, socket
from mpi4py import MPI
import numpy as np
c = MPI.COMM_WORLD
out = np.zeros(4); c.Allreduce(np.full(4, c.Get_rank() + 1.0), out)
print(f"rank {c.Get_rank()}/{c.Get_size()} host={socket.gethostname()} proc={MPI.Get_processor_name()} sum={out[0]}", flush=True)
