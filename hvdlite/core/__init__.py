"""The core a tensor travels through, framework-free: its tensors are NumPy arrays (or device arrays).

Layers, bottom up; each imports only the layers below it (``tests/unit/test_structure.py``):

- :mod:`.work`: what travels -- requests and their handles, responses, fused work items, dtypes,
  names, the scope (which communicator) a request belongs to;
- :mod:`.transport`: MPI, and shared memory inside one host;
- :mod:`.planes`: what moves a work item's tensors (host memory, or a GPU through NCCL or staging);
- :mod:`.pipeline`: one module a stage -- queue, negotiate, fuse, execute, complete -- and the
  cycle that runs them for one communicator, with the timeline and autotune it feeds;
- this package's own modules: :mod:`.engine` (when and on which thread a cycle runs),
  :mod:`.communicators` (one pipeline per process set), :mod:`.arguments` and :mod:`.describe`
  (the submit stage's checks), :mod:`.runtime` (everything held between ``init()`` and
  ``shutdown()``).
"""
