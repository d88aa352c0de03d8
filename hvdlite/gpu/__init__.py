"""The GPU data plane: device tensors reduced with NCCL on the device, or staged through host MPI.

Nothing here imports cupy or loads NCCL until a device tensor is submitted, so CPU-only jobs pay
nothing for it. :mod:`.arrays` is how adapters hand device memory to the core; :mod:`.nccl` binds
NCCL; :mod:`.selection` decides between NCCL and the host-staged path; :mod:`.executor` runs
device work items on the chosen plane.
"""
