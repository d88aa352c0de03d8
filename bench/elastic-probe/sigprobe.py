import os, signal, sys, time
def h(s, f):
    sys.stdout.write(f"pid {os.getpid()} got signal {s}\n"); sys.stdout.flush()
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
    signal.signal(s, h)
from mpi4py import MPI
r = MPI.COMM_WORLD.Get_rank()
print(r, "after init handler USR1:", signal.getsignal(signal.SIGUSR1), flush=True)
if r == 2:
    time.sleep(0.3); os.kill(os.getpid(), 9)
t=time.time()
while time.time()-t < 5: time.sleep(0.05)
print(r, "alive after 5s", flush=True)
os._exit(0)
