"""Prints its pid, then waits inside an allreduce that rank 0 never joins (for signal tests)."""

import os
import time

import numpy as np

import hvdlite as hvd

hvd.init()
print(f"pid {os.getpid()}", flush=True)
if hvd.rank() == 0:
    time.sleep(300)
else:
    hvd.allreduce(np.ones(1), name="waits.forever")
