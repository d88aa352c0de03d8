"""A Horovod job script's settings: HOROVOD_* variables set in the script before hvd.init(), as
Horovod code does. Prints what took effect; rank 0 reports the unsupported names (once)."""

import os

os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
os.environ["HOROVOD_FUSION_THRESHOLD"] = str(8 * 1024 * 1024)  # bytes, as Horovod's
os.environ["HOROVOD_CYCLE_TIME"] = "3.5"  # milliseconds, as Horovod's
os.environ["HOROVOD_CPU_OPERATIONS"] = "gloo"  # hvdlite has no Gloo: reported, not silently dropped

import numpy as np  # noqa: E402

import hvdlite as hvd  # noqa: E402
from hvdlite.core.runtime import current  # noqa: E402

hvd.init()
config = current().config
print(f"fusion={config.fusion_threshold} cycle={config.cycle_time_ms} log={config.log_level}", flush=True)
others = hvd.add_process_set(list(range(1, hvd.size())))  # refused without dynamic process sets
if others.included():
    total = hvd.allreduce(np.array([float(hvd.rank() + 1)]), op=hvd.Sum, process_set=others)
    print(f"others sum {total[0]:g}", flush=True)
hvd.remove_process_set(others)
hvd.shutdown()
