"""A known sequence of operations for the timeline test: argv[1] is the second timeline's path."""

import sys

import numpy as np

import hvdlite as hvd

hvd.init()
hvd.allreduce(np.ones(3), name="first")
hvd.grouped_allreduce([np.ones(2), np.ones(5)], name="pair")
hvd.broadcast(np.ones(2), root_rank=0, name="bcast")
hvd.stop_timeline()
hvd.allreduce(np.ones(3), name="unrecorded")
hvd.start_timeline(sys.argv[1], mark_cycles=True)
hvd.allgather(np.ones((1, 2)), name="second")
hvd.shutdown()
print("done", flush=True)
