"""Shared helpers for the elastic probes (run with the project's venv python)."""
import os
import sys
import threading
import time

T0 = time.time()


def log(rank, *msg):
    sys.stdout.write(f"[{time.time():.3f} pid={os.getpid()} r{rank}] " + " ".join(str(m) for m in msg) + "\n")
    sys.stdout.flush()


def watchdog(seconds, what, rank, code=3):
    """Start a timer that os._exit()s if `what` has not finished within `seconds`; return it (cancel it after)."""
    def fire():
        log(rank, f"WATCHDOG: {what} did not return within {seconds}s -> os._exit({code})")
        os._exit(code)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def wait_or_abandon(req, stall_s, rank, what):
    """Poll `req`; return True if completed, False if no completion within stall_s (request abandoned)."""
    start = time.time()
    while True:
        if req.Test():
            return True, time.time() - start
        if time.time() - start > stall_s:
            return False, time.time() - start
        time.sleep(0.001)


def probe_peers(comm, timeout_s, tag=777):
    """Heartbeat: exchange a small message with every other rank of `comm` (nonblocking).

    Returns the set of ranks that did not answer within timeout_s. Pending requests are leaked.
    """
    import numpy as np
    me, n = comm.Get_rank(), comm.Get_size()
    sbuf = np.array([me], dtype=np.int64)
    rbufs = {p: np.zeros(1, dtype=np.int64) for p in range(n) if p != me}
    sreqs = [comm.Isend(sbuf, dest=p, tag=tag) for p in rbufs]
    rreqs = {p: comm.Irecv(rbufs[p], source=p, tag=tag) for p in rbufs}
    start = time.time()
    pending = set(rreqs)
    while pending and time.time() - start < timeout_s:
        for p in list(pending):
            if rreqs[p].Test():
                pending.discard(p)
        time.sleep(0.001)
    return pending, sreqs, rreqs


def wait_or_failed(req, comm, stall_s, every_s=0.02):
    """Poll `req`; every `every_s` ask MPI (MPIX_Comm_get_failed, i.e. Hydra's PMI_dead_processes) whether a
    process of `comm` died. Return (completed, seconds waited); gives up after stall_s as a fallback."""
    start = time.time()
    last = 0.0
    while True:
        if req.Test():
            return True, time.time() - start
        now = time.time()
        if now - last > every_s:
            last = now
            import ulfm
            if ulfm.get_failed(comm):
                return False, now - start
        if now - start > stall_s:
            return False, now - start
        time.sleep(0.001)
