"""Host allreduces through the shared-memory window (every rank on this host), against a local
reduction, at np=2 and np=3 (oversubscribed); and the setting that leaves them to MPI."""

import pytest

from .harness import run_script

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("np", [2, 3])
def test_every_op_dtype_and_size_through_shared_memory(np):
    # Down to one element, so ranks own empty parts; up to several slots, so chunks alternate slots.
    result = run_script("shm.py", np, "check", env={"HVDLITE_SHM_MIN_BYTES": "1"}, timeout=240)
    for rank in range(np):
        assert result.lines(rank)[:1] == ["shm on"] and "ok check" in result.lines(rank), result.output


def test_the_same_through_mpi_when_shared_memory_is_off():
    result = run_script("shm.py", 2, "check", env={"HVDLITE_SHM": "0", "HVDLITE_SHM_MIN_BYTES": "1"},
                        timeout=240)
    for rank in range(2):
        assert result.lines(rank)[:1] == ["shm off"] and "ok check" in result.lines(rank), result.output
