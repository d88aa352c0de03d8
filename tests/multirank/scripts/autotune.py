"""Allreduce a fixed 'step' of tensors until autotune settles; print the settings and check the sums."""

import time

import numpy as np

import hvdlite as hvd
from hvdlite.core.runtime import current

hvd.init()
rank, size = hvd.rank(), hvd.size()
# A step: small tensors (fused up to the threshold) and large ones (cut into chunks).
tensors = [np.full(5_000, rank + 1.0, np.float32) for _ in range(20)] + [np.full(600_000, rank + 1.0, np.float32)
                                                                         for _ in range(2)]
expected = size * (size + 1) / 2
engine = current().engine
deadline = time.monotonic() + 100
steps = 0
settled = None
while time.monotonic() < deadline:
    results = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="step")
    assert all(np.all(r == expected) for r in results), f"wrong sum at step {steps}"
    steps += 1
    # Every rank learns the end of the search from rank 0, in the same step, so all leave together.
    done = hvd.broadcast_object(engine.pipeline.tuner.done if rank == 0 else None, root_rank=0, name=f"done.{steps}")
    if done:
        settled = engine.params
        break
assert settled is not None, "autotune did not finish in time"
for _ in range(5):  # the chosen settings stay, and every rank uses them
    hvd.grouped_allreduce(tensors, op=hvd.Sum, name="step")
    assert engine.params == settled
print(f"settled fusion_threshold={settled.fusion_threshold} chunk_bytes={settled.chunk_bytes} after {steps} steps")
hvd.shutdown()
