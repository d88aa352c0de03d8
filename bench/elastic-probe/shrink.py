"""Experiment 1 (+5): one rank SIGKILLs itself mid-run; survivors detect, shrink, allreduce.

usage: mpiexec -disable-auto-cleanup -n 3 python shrink.py [--elems N] [--stall S] [--victim R]
                 [--kill-step K] [--inside] [--free-old] [--end exit|finalize] [--steps M]
"""
import argparse
import os
import signal
import time

import sys
USR1 = []
if "--usr1-before" in sys.argv:  # a Python SIGUSR1 handler installed before MPI_Init (MPICH chains to it)
    signal.signal(signal.SIGUSR1, lambda s, f: USR1.append(time.time()))
import numpy as np
from mpi4py import MPI

from common import T0, log, probe_peers, wait_or_abandon, wait_or_failed, watchdog

ap = argparse.ArgumentParser()
ap.add_argument("--elems", type=int, default=1024)
ap.add_argument("--stall", type=float, default=2.0)
ap.add_argument("--victim", type=int, default=2)
ap.add_argument("--kill-step", type=int, default=3)
ap.add_argument("--inside", action="store_true", help="victim posts the Iallreduce, then dies 50 ms later")
ap.add_argument("--free-old", action="store_true", help="try Free() on the old comms (watchdog 10 s)")
ap.add_argument("--end", choices=["exit", "finalize", "sysexit"], default="exit")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--probe", type=float, default=1.0, help="heartbeat timeout to find the dead ranks")
ap.add_argument("--detect", choices=["stall", "getfailed"], default="stall",
                help="stall: no completion for --stall s; getfailed: poll MPIX_Comm_get_failed (PMI_dead_processes)")
ap.add_argument("--method", choices=["create_group", "shrink", "mpix_shrink"], default="create_group")
ap.add_argument("--parent", choices=["world", "work"], default="world",
                help="communicator Create_group is called on (work = the one with the abandoned request)")
ap.add_argument("--usr1-before", action="store_true")
ap.add_argument("--usr1-after", action="store_true", help="Python SIGUSR1 handler installed after MPI_Init")
ap.add_argument("--killfile", default="/tmp/elastic_probe/run/killtime")
args = ap.parse_args()

if args.usr1_after:
    signal.signal(signal.SIGUSR1, lambda s, f: USR1.append(time.time()))
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
log(rank, f"up size={size} host={MPI.Get_processor_name()} thread={MPI.Query_thread()}")
work, hb = world.Dup(), world.Dup()
sbuf = np.full(args.elems, rank + 1.0)
rbuf = np.zeros(args.elems)
leaked = []
for step in range(args.kill_step + 5):
    if rank == args.victim and step == args.kill_step and not args.inside:
        with open(args.killfile, "w") as f:
            f.write(repr(time.time()))
        log(rank, "SIGKILL myself before posting step", step)
        os.kill(os.getpid(), signal.SIGKILL)
    req = work.Iallreduce(sbuf, rbuf, op=MPI.SUM)
    if rank == args.victim and step == args.kill_step:
        time.sleep(0.05)
        with open(args.killfile, "w") as f:
            f.write(repr(time.time()))
        log(rank, "SIGKILL myself with step", step, "posted")
        os.kill(os.getpid(), signal.SIGKILL)
    if args.detect == "getfailed":
        ok, waited = wait_or_failed(req, world, args.stall)
    else:
        ok, waited = wait_or_abandon(req, args.stall, rank, f"step {step}")
    if ok:
        assert rbuf[0] == size * (size + 1) / 2, rbuf[0]
        continue
    t_detect = time.time()
    leaked.append(req)
    log(rank, f"SIGUSR1 seen at {[round(t - T0, 3) for t in USR1]} (s since start)")
    log(rank, f"step {step}: no completion for {waited:.2f}s -> abandon request")
    break
else:
    log(rank, "no failure seen")
    os._exit(0)

kill_t = float(open(args.killfile).read())
if args.detect == "getfailed":
    import ulfm
    dead = set(ulfm.get_failed(world))
else:
    dead, sreqs, rreqs = probe_peers(hb, args.probe)
    leaked += sreqs + list(rreqs.values())
t_probe = time.time()
log(rank, f"dead={sorted(dead)} found by {args.detect} in {t_probe - t_detect:.3f}s")
if args.method == "mpix_shrink":
    import ulfm
    w = watchdog(20, "MPIX_Comm_shrink()", rank, code=6)
    new = ulfm.shrink(world)
    w.cancel()
elif args.method == "shrink":
    w = watchdog(20, "Comm.Shrink()", rank, code=6)
    new = work.Shrink()
    w.cancel()
else:
    parent = work if args.parent == "work" else world
    group = parent.Get_group().Excl(sorted(dead))
    new = parent.Create_group(group, tag=4242)  # old request on `work` still pending here
t_new = time.time()
nr, ns = new.Get_rank(), new.Get_size()
out = np.zeros(args.elems)
new.Allreduce(np.full(args.elems, nr + 1.0), out, op=MPI.SUM)
t_first = time.time()
assert out[0] == ns * (ns + 1) / 2, out[0]
log(rank, f"new comm rank {nr}/{ns}: detect={t_detect - kill_t:.3f}s probe_done={t_probe - kill_t:.3f}s "
          f"comm_created={t_new - kill_t:.3f}s (create took {t_new - t_probe:.3f}s) "
          f"first_allreduce={t_first - kill_t:.3f}s after kill")
for _ in range(args.steps):
    new.Allreduce(np.full(args.elems, nr + 1.0), out, op=MPI.SUM)
    assert out[0] == ns * (ns + 1) / 2
log(rank, f"{args.steps} more allreduces of {args.elems * 8} bytes ok, {time.time() - t_first:.3f}s")

if args.free_old:
    for name, c in (("work", work), ("hb", hb)):
        w = watchdog(10, f"{name}.Free()", rank, code=4)
        t = time.time()
        c.Free()
        w.cancel()
        log(rank, f"{name}.Free() returned in {time.time() - t:.3f}s")
if args.end == "finalize":
    import faulthandler
    # faulthandler's watchdog is a C thread: it fires even if an MPI call holds the GIL.
    faulthandler.dump_traceback_later(float(os.environ.get("FINALIZE_WAIT", "15")), exit=True)
    t = time.time()
    log(rank, "calling new.Free()")
    new.Free()
    log(rank, f"new.Free() returned in {time.time() - t:.3f}s; calling MPI.Finalize()")
    t = time.time()
    MPI.Finalize()
    faulthandler.cancel_dump_traceback_later()
    log(rank, f"MPI.Finalize() returned in {time.time() - t:.3f}s; exiting 0")
    os._exit(0)
if args.end == "sysexit":
    import faulthandler
    faulthandler.dump_traceback_later(float(os.environ.get("FINALIZE_WAIT", "15")), exit=True)
    log(rank, f"sys.exit(0) with mpi4py.rc.finalize={__import__('mpi4py').rc.finalize}")
    sys.exit(0)
log(rank, "os._exit(0)")
os._exit(0)
