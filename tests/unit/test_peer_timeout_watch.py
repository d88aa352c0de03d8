"""PeerTimeoutWatch on a real (one-process) MPI communicator: a pending probe message ends the wait."""

import numpy as np
import pytest
from mpi4py import MPI

from hvdlite import errors
from hvdlite.core.transport.mpi import _PROBE_TAG, PeerTimeoutWatch
from hvdlite.utils.polling import WaitTimeout, wait_until


def test_a_peers_probe_message_ends_the_wait_and_is_left_for_the_probe():
    comm = MPI.COMM_SELF.Dup()
    asked = []
    watch = PeerTimeoutWatch(comm, 7.0, then=lambda: asked.append(1), every=0.0)
    watch()  # nothing pending: only the chained watch is asked
    assert asked == [1]
    token = np.zeros(1, np.uint8)
    send = comm.Isend(token, dest=0, tag=_PROBE_TAG)
    with pytest.raises(WaitTimeout) as caught:
        wait_until(lambda: False, 0.0, 0.001, timeout=60.0, probe=watch)
    assert caught.value.seconds == 7.0 and caught.value.peer == 0
    inbox = np.ones(1, np.uint8)
    comm.Recv(inbox, source=0, tag=_PROBE_TAG)  # still there for reachable_peers' receive
    send.Wait()
    assert inbox[0] == 0
    comm.Free()


def test_the_timeout_error_says_which_peer_ended_the_wait():
    own = errors.comm_timeout(2, 3, "negotiation", 4.0, {0, 2}, 2.0, 4.0)
    ended = errors.comm_timeout(2, 3, "negotiation", 4.0, {0, 2}, 2.0, 4.0, peer=0)
    assert "rank 2: negotiation made no progress for 4 s (HVDLITE_COMM_TIMEOUT_SECONDS=4)" in str(own)
    assert ("rank 2: negotiation was ended by rank 0, whose wait made no progress for 4 s "
            "(HVDLITE_COMM_TIMEOUT_SECONDS=4); rank(s) [1] did not answer") in str(ended)
    assert ended.unreachable == own.unreachable == [1]
