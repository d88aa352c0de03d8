"""multihost.py's cases, after leaving freed chunks of dense bytes all over the malloc heap.

MPICH's UCX business card is padded to 4096 bytes with the memory that follows UCX's address
(see hvdlite/core/mpi_start.py). Here that memory is hex text, which MPICH cannot shorten when it
encodes the card for PMI: every segment's PMI-1 line is then longer than the 1024 bytes Slurm's
pmi2 plugin reads at once. Usage: the same arguments as multihost.py.
"""

import os
import runpy
import sys

kept, freed = [], []
for i in range(20_000):  # above 512 bytes: malloc's chunks, not Python's small-object arenas
    (kept if i % 2 else freed).append(os.urandom(520 + (i * 37) % 3000).hex().encode())
del freed
sys.argv = [os.path.join(os.path.dirname(__file__), "multihost.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
