"""Prints 'up <rank>' after hvd.init(), then all-reduces every 0.1 s for SECONDS (default a minute):
a job to kill. Usage: [SECONDS]."""

import sys
import time

import numpy as np

import hvdlite as hvd

hvd.init()
print(f"up {hvd.rank()}", flush=True)
for _ in range(int(float(sys.argv[1] if len(sys.argv) > 1 else 60) * 10)):
    hvd.allreduce(np.ones(4), name="x")
    time.sleep(0.1)
