"""What a killed job leaves on hvdliterun's host: MPICH's shared-memory segments in ``/dev/shm``.

MPICH creates ``/dev/shm/mpich_shm_*`` files (2 MiB and up) for the ranks of one host and unlinks
them once every rank has mapped them; a rank killed in between leaves the file for good. The
launcher knows when its job ran: segments that appeared meanwhile and that no process maps any
more are its job's leftovers. Another job's segment is never taken: a segment counts only if it
is unmapped in two looks a moment apart (a creator maps its file right after making it).
"""

from __future__ import annotations

import os
import re
import sys
import time

SHM_DIR = "/dev/shm"
_SEGMENT = re.compile(r"mpich_shm_[A-Za-z0-9_]+")


def segments(directory: str = SHM_DIR) -> set[str]:
    """The names of MPICH's segments in ``directory``."""
    try:
        return {name for name in os.listdir(directory) if _SEGMENT.fullmatch(name)}
    except OSError:
        return set()


def mapped(directory: str = SHM_DIR) -> set[str]:
    """The names of files in ``directory`` that some process of this host maps (``/proc/*/maps``)."""
    prefix = directory.rstrip("/") + "/"
    names: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    start = line.find(prefix)
                    if start >= 0:
                        names.add(line[start + len(prefix):].split()[0])
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return names


def remove_leftover_segments(before: set[str], directory: str = SHM_DIR, settle: float = 0.2) -> list[str]:
    """Unlink the segments that appeared since ``before`` and that nobody maps; returns their names."""
    candidates = segments(directory) - before
    if candidates:  # the common case has none: no need to read every process's maps
        candidates -= mapped(directory)
    if not candidates:
        return []
    time.sleep(settle)
    removed = []
    for name in sorted(candidates - mapped(directory)):
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except OSError:
            continue
    if removed:
        sys.stderr.write(f"hvdliterun: removed {len(removed)} shared-memory segment(s) the job's ranks left in "
                         f"{directory}\n")
    return removed
