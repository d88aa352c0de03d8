"""Prints 'up <rank>' after hvd.init(), then all-reduces every 0.1 s for a minute (a job to kill)."""

import time

import numpy as np

import hvdlite as hvd

hvd.init()
print(f"up {hvd.rank()}", flush=True)
for _ in range(600):
    hvd.allreduce(np.ones(4), name="x")
    time.sleep(0.1)
