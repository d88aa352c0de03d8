"""Launch rank 2 exits with status 3 before hvd.init(); the others are left waiting inside MPI's start-up.
Run with ``hvdliterun -np 3 --min-np 2``: the launcher must end the job, saying why."""

import os
import sys

if os.environ.get("PMI_RANK") == "2":
    sys.exit(3)

import hvdlite as hvd  # noqa: E402

hvd.init()
print("unreachable: init finished without rank 2", flush=True)
