"""Jobs across hosts, and peers that vanish. Usage: CASE [ARGS].

where MB            print where this rank runs and what reached it; allreduce MB megabytes
die RANK HOW [N] [LATE]
                    RANK ends after a few steps (HOW: kill = SIGKILL, stop = SIGSTOP); others keep going;
                    the steps allreduce N float32 (default 1024); from 1 MB on, RANK ends 5 ms into a step;
                    the last rank pauses (SIGSTOP, engine included) for LATE seconds before that step (default 0)
loop OUT_DIR        allreduce until it fails; each rank writes its error to OUT_DIR/rank.R.err
"""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

import hvdlite as hvd

hvd.init()
RANK = hvd.rank()


def case_where(megabytes: str) -> None:
    print(f"where rank={RANK} host={os.uname().nodename} local={hvd.local_rank()}/{hvd.local_size()} "
          f"cross={hvd.cross_rank()}/{hvd.cross_size()} forwarded={os.environ.get('HVDLITE_TEST_FORWARDED')} "
          f"pythonpath={os.environ.get('PYTHONPATH')} timeout={os.environ.get('HVDLITE_COMM_TIMEOUT_SECONDS')} "
          f"netmod={os.environ.get('MPIR_CVAR_CH4_NETMOD')}",
          flush=True)
    count = int(float(megabytes) * 1024 * 1024) // 4
    total = hvd.allreduce(np.full(count, RANK + 1, dtype=np.float32), op=hvd.Sum, name="payload")
    expected = hvd.size() * (hvd.size() + 1) / 2
    assert np.all(total == expected), f"rank {RANK}: allreduce gave {np.unique(total)[:5]}, expected {expected}"
    print("ok where", flush=True)


def case_die(victim: str, how: str, count: str = "1024", late: str = "0") -> None:
    x = np.ones(int(count), dtype=np.float32)
    straggler = hvd.size() - 1 if hvd.size() - 1 != int(victim) else None

    def end() -> None:
        print(f"rank {RANK} pid {os.getpid()} {how}s itself", flush=True)
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)

    for step in range(10_000):
        if step == 3 and RANK == int(victim):
            if x.nbytes < 1 << 20:
                end()
            else:  # most likely inside the transfer, which takes milliseconds
                threading.Timer(0.005, end).start()
        if step == 3 and RANK == straggler and float(late):
            subprocess.Popen(["sh", "-c", f"sleep {late}; kill -CONT {os.getpid()}"])
            os.kill(os.getpid(), signal.SIGSTOP)  # a straggler: its waits start LATE seconds after its peers'
        hvd.allreduce(x, name="step")
        time.sleep(0.01)
    raise SystemExit(f"rank {RANK}: the job outlived the loss of rank {victim}")


def case_loop(out_dir: str) -> None:
    x = np.ones(1 << 16, dtype=np.float32)
    print(f"ready rank {RANK} pid {os.getpid()}", flush=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            hvd.allreduce(x, name="loop")
            time.sleep(0.01)
    except hvd.HvdliteError as exc:  # the remote side's output cannot cross a dead link: keep it on disk
        with open(os.path.join(out_dir, f"rank.{RANK}.err"), "w") as handle:
            handle.write(f"{type(exc).__name__}: {exc}\n")
        raise
    raise SystemExit(f"rank {RANK}: nothing failed within 120 s")


if __name__ == "__main__":
    case, *args = sys.argv[1:]
    {"where": case_where, "die": case_die, "loop": case_loop}[case](*args)
