"""Experiments 1+2 (+4): a rank is SIGKILLed; survivors detect it, shrink, then grow back by MPI_Comm_spawn.

Run under Hydra with -disable-auto-cleanup and every rank wrapped by rankwrap.sh, e.g.
  mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python elastic.py [options]
The same file is the spawned replacement (it finds a parent communicator).

Timing: the victim writes time.time() to --killfile right before SIGKILLing itself; all processes
share this machine's clock.
"""
import argparse
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from common import log, wait_or_abandon, wait_or_failed

ap = argparse.ArgumentParser()
ap.add_argument("--elems", type=int, default=1024)
ap.add_argument("--victim", type=int, default=2)
ap.add_argument("--kill-step", type=int, default=3)
ap.add_argument("--inside", action="store_true", help="victim dies 50 ms after posting its Iallreduce")
ap.add_argument("--detect", choices=["stall", "getfailed"], default="getfailed")
ap.add_argument("--stall", type=float, default=10.0)
ap.add_argument("--spawn", type=int, default=1, help="how many replacements to spawn (0: none)")
ap.add_argument("--host", default="", help="'host' info key for MPI_Comm_spawn")
ap.add_argument("--wrap", default="", help="spawn this wrapper (e.g. ./rankwrap.sh) in front of python")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--killfile", default="/tmp/elastic_probe/run/killtime")
ap.add_argument("--second", choices=["none", "spawned", "original"], default="none",
                help="after growing, a second process dies: the spawned one or original rank 1")
ap.add_argument("--second-detect", choices=["getfailed", "heartbeat"], default="getfailed",
                help="getfailed: MPIX_Comm_get_failed, heartbeat if it reports nothing; heartbeat: everyone "
                     "waits for the 3 s stall then exchanges heartbeats (the same view on every survivor)")
ap.add_argument("--parent", choices=["work", "world"], default="work",
                help="communicator for Create_group (work holds the abandoned Iallreduce)")
ap.add_argument("--parents-high", action="store_true", help="Merge with high=True on the survivors, False on the child")
ap.add_argument("--how", choices=["kill", "exit"], default="kill", help="victim: SIGKILL itself, or os._exit(3)")
ap.add_argument("--env", action="append", default=[], help="VAR=VALUE for the spawned processes (info key 'env')")
args = ap.parse_args()


def allreduce_check(comm, what):
    n, me = comm.Get_size(), comm.Get_rank()
    out = np.zeros(args.elems)
    comm.Allreduce(np.full(args.elems, me + 1.0), out, op=MPI.SUM)
    assert out[0] == n * (n + 1) / 2 and out[-1] == out[0], (what, out[0])


def run_steps(comm, who):
    t = time.time()
    for _ in range(args.steps):
        allreduce_check(comm, "steps")
    log(who, f"{args.steps} allreduces of {args.elems * 8} B on size {comm.Get_size()} ok in {time.time() - t:.3f}s")


def second_failure(merged, who, i_am_victim):
    """Grown world: one process dies inside an Iallreduce; the others detect, shrink, allreduce."""
    hb = merged.Dup()
    work2 = merged.Dup()
    sb, rb = np.ones(args.elems), np.zeros(args.elems)
    for step in range(10):
        req = work2.Iallreduce(sb, rb, op=MPI.SUM)
        if i_am_victim and step == 3:
            time.sleep(0.05)
            open(args.killfile, "w").write(repr(time.time()))
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if args.second_detect == "heartbeat":
            ok, waited = wait_or_abandon(req, 3.0, who, "")
        else:
            ok, waited = wait_or_failed(req, merged, 3.0)
        if not ok:
            break
    else:
        log(who, "second failure not seen")
        os._exit(1)
    kill_t = float(open(args.killfile).read())
    import ulfm
    from common import probe_peers
    dead = ulfm.get_failed(merged) if args.second_detect == "getfailed" else []
    how = "MPIX_Comm_get_failed"
    if not dead:
        pending, _, _ = probe_peers(hb, 1.0)
        dead, how = sorted(pending), "heartbeat after 3 s stall"
    t_found = time.time()
    new2 = work2.Create_group(work2.Get_group().Excl(dead), tag=4343)
    allreduce_check(new2, "second shrink")
    log(who, f"second failure: dead={dead} (merged ranks) found by {how} {t_found - kill_t:.3f}s after the kill; "
             f"shrunk to {new2.Get_rank()}/{new2.Get_size()}, first allreduce {time.time() - kill_t:.3f}s after the kill")
    run_steps(new2, who)


parent = MPI.Comm.Get_parent()
if parent != MPI.COMM_NULL:
    # ---- the spawned replacement ----
    t0 = time.time()
    me = f"spawned(world {MPI.COMM_WORLD.Get_rank()}/{MPI.COMM_WORLD.Get_size()})"
    log(me, f"up on host {MPI.Get_processor_name()}: parent remote size {parent.Get_remote_size()}, "
            f"HVD_TEST_ENV={os.environ.get('HVD_TEST_ENV')}")
    merged = parent.Merge(high=not args.parents_high)
    log(me, f"merged: rank {merged.Get_rank()}/{merged.Get_size()} ({time.time() - t0:.3f}s after start of Merge)")
    allreduce_check(merged, "first")
    run_steps(merged, me)
    if args.second != "none":
        second_failure(merged, me, args.second == "spawned")
    log(me, "os._exit(0)")
    sys.stdout.flush()
    os._exit(0)

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
work = world.Dup()
sbuf, rbuf = np.full(args.elems, rank + 1.0), np.zeros(args.elems)
for step in range(args.kill_step + 5):
    if rank == args.victim and step == args.kill_step and not args.inside:
        open(args.killfile, "w").write(repr(time.time()))
        os._exit(3) if args.how == "exit" else os.kill(os.getpid(), signal.SIGKILL)
    req = work.Iallreduce(sbuf, rbuf, op=MPI.SUM)
    if rank == args.victim and step == args.kill_step:
        time.sleep(0.05)
        open(args.killfile, "w").write(repr(time.time()))
        os._exit(3) if args.how == "exit" else os.kill(os.getpid(), signal.SIGKILL)
    if args.detect == "getfailed":
        ok, waited = wait_or_failed(req, world, args.stall)
    else:
        ok, waited = wait_or_abandon(req, args.stall, rank, "")
    if not ok:
        break
else:
    log(rank, "no failure seen")
    os._exit(1)

kill_t = float(open(args.killfile).read())
t_detect = time.time()
if args.detect == "getfailed":
    import ulfm
    dead = ulfm.get_failed(world)
else:
    dead = [args.victim]  # the stall probe (shrink.py) finds it by a heartbeat; here we take it as known
log(rank, f"dead={dead} (detected {t_detect - kill_t:.3f}s after the kill); Create_group on {args.parent}")
parent_comm = work if args.parent == "work" else world
new = parent_comm.Create_group(parent_comm.Get_group().Excl(dead), tag=4242)
allreduce_check(new, "shrunk")
t_shrunk = time.time()
log(rank, f"dead={dead}: shrunk to rank {new.Get_rank()}/{new.Get_size()}; detected {t_detect - kill_t:.3f}s, "
          f"first allreduce {t_shrunk - kill_t:.3f}s after the kill")
run_steps(new, rank)
if args.spawn:
    info = MPI.Info.Create()
    if args.host:
        info.Set("host", args.host)
    if args.env:
        info.Set("env", "\n".join(args.env))
    cmd, cargs = sys.executable, [os.path.abspath(__file__), "--elems", str(args.elems), "--steps", str(args.steps),
                                  "--second", args.second, "--second-detect", args.second_detect]
    if args.parents_high:
        cargs.append("--parents-high")
    if args.wrap:
        cmd, cargs = os.path.abspath(args.wrap), [sys.executable] + cargs
    t = time.time()
    inter = new.Spawn(cmd, args=cargs, maxprocs=args.spawn, info=info, root=0)
    t_spawned = time.time()
    merged = inter.Merge(high=args.parents_high)
    t_merged = time.time()
    allreduce_check(merged, "grown")
    t_grown = time.time()
    log(rank, f"spawn {t_spawned - t:.3f}s, merge {t_merged - t_spawned:.3f}s, first allreduce "
              f"{t_grown - t_merged:.3f}s; now rank {merged.Get_rank()}/{merged.Get_size()}; "
              f"{t_grown - kill_t:.3f}s after the kill")
    run_steps(merged, rank)
    if args.second != "none":
        second_failure(merged, rank, args.second == "original" and rank == 1)
log(rank, "os._exit(0)")
sys.stdout.flush()
os._exit(0)
