"""A warm spare's first moment: MPI starts before the training script runs (run by path, not imported).

Rank 0 starts a spare with ``MPI_Comm_spawn``, which returns only once the new process has started
MPI and holds MPICH's lock until then, so rank 0's training thread could make no MPI call meanwhile
(measured: a spawn whose child started MPI 3 s late stopped the other thread's allreduces for 3.1 s).
Were the spare to start MPI in ``hvd.init()``, after the script imported its framework, the world
would stand still for that import. So a spare runs ``python .../spare_start.py path|module TARGET
ARGS...``: it imports mpi4py's ``MPI`` (which starts MPI; nothing of hvdlite, which would take longer)
and then runs the script as ``python TARGET ARGS`` or ``python -m TARGET ARGS`` would, whose
``hvd.init()`` waits for admission (:func:`hvdlite.elastic.spares.wait_for_admission`).
"""

import os
import runpy
import sys


def main() -> None:
    from mpi4py import MPI  # noqa: F401 - importing it starts MPI

    kind, target, *args = sys.argv[1:]
    sys.argv = [target, *args]
    if kind == "module":
        sys.path[0] = os.getcwd()  # as python -m sets it (not this file's folder)
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(target)  # as python SCRIPT sets it
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
