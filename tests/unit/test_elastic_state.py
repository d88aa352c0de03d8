"""hvdlite.elastic's state logic in process: the broadcast is a function given to the state."""

import pytest

from hvdlite.elastic import ObjectState, run
from hvdlite.errors import HorovodInternalError, HostsUpdatedInterrupt


def make(**kwargs):
    sent = []

    def bcast(obj):
        sent.append(obj)
        return obj

    return ObjectState(bcast, lambda: 0, **kwargs), sent


def test_restore_brings_back_the_last_commit_and_copies_mutable_attributes():
    state, _ = make(epoch=0, seen=[])
    state.epoch, state.seen = 1, [1]
    state.commit()
    state.seen.append(2)
    state.epoch = 5
    state.restore()
    assert state.epoch == 1 and state.seen == [1]
    state.seen.append(3)  # a restored attribute is a copy: the commit stays as it was
    state.restore()
    assert state.seen == [1]


def test_a_host_update_interrupts_the_next_commit_once():
    state, sent = make(step=0)
    state.commit()
    state.on_hosts_updated(7)
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()
    state.commit()  # the same update does not interrupt twice
    # Every check broadcasts rank 0's latest timestamp (and its plan: none outside elastic mode).
    assert sent == [(0, None), (7, None), (7, None)]


def test_run_resets_after_a_host_update_and_restores_then_raises_on_a_failure():
    state, _ = make(batch=0)
    resets, calls = [], []
    state.register_reset_callbacks([lambda: resets.append(True)])

    @run
    def train(state):
        calls.append(state.batch)
        if len(calls) == 1:
            state.on_hosts_updated(1)
            state.commit()
        state.batch = 3
        state.commit()
        state.batch = 4
        raise HorovodInternalError("peer failed")

    with pytest.raises(HorovodInternalError):
        train(state)
    assert calls == [0, 0] and resets == [True] and state.batch == 3
