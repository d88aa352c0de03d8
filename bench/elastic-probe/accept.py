"""Experiment 3, job side: np=3, rank 2 SIGKILLs itself, the survivors shrink, then rank 0 opens a port,
writes its name to --portfile and the survivors MPI_Comm_accept a process started outside this job."""
import argparse
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from common import log, wait_or_failed

ap = argparse.ArgumentParser()
ap.add_argument("--portfile", default="/tmp/elastic_probe/run/port")
ap.add_argument("--elems", type=int, default=1024)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--no-kill", action="store_true")
ap.add_argument("--publish", default="", help="also MPI_Publish_name under this service name (needs a name server)")
args = ap.parse_args()


def check(comm):
    n, me = comm.Get_size(), comm.Get_rank()
    out = np.zeros(args.elems)
    comm.Allreduce(np.full(args.elems, me + 1.0), out, op=MPI.SUM)
    assert out[0] == n * (n + 1) / 2, out[0]


world = MPI.COMM_WORLD
rank = world.Get_rank()
comm = world
if not args.no_kill:
    work = world.Dup()
    sbuf, rbuf = np.ones(args.elems), np.zeros(args.elems)  # must outlive the (possibly abandoned) request
    for step in range(8):
        if rank == 2 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        req = work.Iallreduce(sbuf, rbuf, op=MPI.SUM)
        ok, _ = wait_or_failed(req, world, 10)
        if not ok:
            break
    import ulfm
    dead = ulfm.get_failed(world)
    comm = work.Create_group(work.Get_group().Excl(dead), tag=11)
    check(comm)
    log(rank, f"dead={dead}; shrunk to {comm.Get_rank()}/{comm.Get_size()}")
port = None
if comm.Get_rank() == 0:
    port = MPI.Open_port()
    tmp = args.portfile + ".tmp"
    open(tmp, "w").write(port)
    os.rename(tmp, args.portfile)
    log(rank, f"port name: {port!r} written to {args.portfile}")
    if args.publish:
        MPI.Publish_name(args.publish, port)
        log(rank, f"published as {args.publish!r}")
t = time.time()
inter = comm.Accept(port, root=0)
t_acc = time.time()
merged = inter.Merge(high=False)
check(merged)
log(rank, f"accepted (waited {t_acc - t:.3f}s incl. joiner start-up), merge+allreduce {time.time() - t_acc:.3f}s; "
          f"rank {merged.Get_rank()}/{merged.Get_size()}")
t = time.time()
for _ in range(args.steps):
    check(merged)
log(rank, f"{args.steps} allreduces on size {merged.Get_size()} ok in {time.time() - t:.3f}s; os._exit(0)")
if comm.Get_rank() == 0:
    if args.publish:
        MPI.Unpublish_name(args.publish, port)
    MPI.Close_port(port)
sys.stdout.flush()
os._exit(0)
