"""The launcher itself dies (SIGKILL, nothing can run in it): its mpiexec is killed by the kernel
(PR_SET_PDEATHSIG), and with it every rank, static or elastic. No orphaned job keeps running."""

import os
import signal
import subprocess
import threading
import time
import uuid

import pytest

from .harness import ONE_THREAD, SCRIPTS, hvdliterun
from .test_multihost import _assert_nothing_left

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("flags", [[], ["--min-np", "2"]], ids=["static", "elastic"])
def test_a_killed_launcher_takes_its_ranks_with_it(flags):
    marker = f"HVDLITE_TEST_JOB={uuid.uuid4().hex}"
    process = subprocess.Popen([hvdliterun(), "-np", "3", *flags, "-x", marker, "python",
                                str(SCRIPTS / "allreduce_forever.py")], env={**os.environ, **ONE_THREAD},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    up = threading.Event()
    lines: list[str] = []

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if sum(" up " in f" {x}" for x in lines) == 3:
                up.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert up.wait(120), "ranks did not start:\n" + "".join(lines)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    time.sleep(0.5)
    _assert_nothing_left(marker, within=30)
