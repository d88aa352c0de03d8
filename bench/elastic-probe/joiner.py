"""Experiment 3, joiner side: a process started outside the job connects to the port named in --portfile."""
import argparse
import os
import sys
import time

T_START = time.time()
import numpy as np
from mpi4py import MPI

from common import log

ap = argparse.ArgumentParser()
ap.add_argument("--portfile", default="/tmp/elastic_probe/run/port")
ap.add_argument("--lookup", default="", help="MPI_Lookup_name this service instead of reading the file")
ap.add_argument("--elems", type=int, default=1024)
ap.add_argument("--steps", type=int, default=20)
args = ap.parse_args()
t_init = time.time()
me = f"joiner(world {MPI.COMM_WORLD.Get_rank()}/{MPI.COMM_WORLD.Get_size()})"
if args.lookup:
    port = MPI.Lookup_name(args.lookup)
else:
    while not os.path.exists(args.portfile):
        time.sleep(0.01)
    port = open(args.portfile).read()
log(me, f"MPI init took {t_init - T_START:.3f}s; connecting to {port!r}")
t = time.time()
inter = MPI.COMM_WORLD.Connect(port, root=0)
t_conn = time.time()
merged = inter.Merge(high=True)
n, r = merged.Get_size(), merged.Get_rank()
out = np.zeros(args.elems)
merged.Allreduce(np.full(args.elems, r + 1.0), out, op=MPI.SUM)
assert out[0] == n * (n + 1) / 2
log(me, f"connect {t_conn - t:.3f}s, merge+allreduce {time.time() - t_conn:.3f}s; rank {r}/{n}")
for _ in range(args.steps):
    merged.Allreduce(np.full(args.elems, r + 1.0), out, op=MPI.SUM)
    assert out[0] == n * (n + 1) / 2
log(me, f"{args.steps} allreduces ok; os._exit(0)")
sys.stdout.flush()
os._exit(0)
