"""The elastic job's host bookkeeping (hvdlite.elastic.hosts) and the launcher's discovery, as pure logic."""

import math
import os
import stat

import pytest
from hvdlite.runner.cluster.hosts import DiscoveryError, HostSlots
from hvdlite.runner.elastic.discovery import discover, published

from hvdlite.elastic.hosts import HostBook, Plan, as_spares, read_hosts_file, served_by_spares, write_hosts_file


def test_free_slots_are_filled_in_the_lists_order_up_to_max_np():
    book = HostBook(hosts={"a": 2, "b": 2})
    assert book.plan(["a", "a"], now=0) == Plan(spawn=(("b", 2),))
    assert book.plan(["a", "b", "a", "b"], now=0) == Plan()
    capped = HostBook(max_np=3, hosts={"a": 2, "b": 2})
    assert capped.plan(["a"], now=0) == Plan(spawn=(("a", 1), ("b", 1)))
    assert not Plan() and Plan(remove=(1,)) and Plan(spawn=(("a", 1),)).new_ranks == 1


def test_ranks_on_a_host_that_left_or_shrank_leave_highest_first():
    book = HostBook(hosts={"a": 1, "c": 1})
    assert book.plan(["a", "b", "a", "b"], now=0) == Plan(spawn=(("c", 1),), remove=(1, 2, 3))
    assert HostBook().plan(["a", "b"], now=0) == Plan()  # no list published yet: nothing to change


def test_a_failed_host_is_blacklisted_for_good_without_a_cooldown_but_its_survivors_stay():
    book = HostBook(hosts={"a": 3})
    book.record_failure("a", now=10)
    assert book.blacklisted_until["a"] == math.inf
    assert book.plan(["a", "a"], now=1e9) == Plan()  # no replacement, and nobody removed
    assert not book.can_grow_later(now=11)


def test_a_cooldown_ends_and_doubles_with_each_failure_the_same_on_every_rank():
    book, twin = HostBook(cooldown=(1, 2), hosts={"a": 3}), HostBook(cooldown=(1, 2), hosts={"a": 3})
    book.record_failure("a", now=100)
    twin.record_failure("a", now=100)
    first = book.blacklisted_until["a"] - 100
    assert 1 <= first <= 2 and twin.blacklisted_until == book.blacklisted_until  # no communication needed
    assert book.plan(["a", "a"], now=100) == Plan() and book.can_grow_later(now=100)
    assert book.plan(["a", "a"], now=100 + first) == Plan(spawn=(("a", 1),))
    book.record_failure("a", now=200)
    assert 2 <= book.blacklisted_until["a"] - 200 <= 4


def test_the_hosts_file_round_trips_and_a_missing_one_is_none(tmp_path):
    path = str(tmp_path / "elastic.hosts")
    assert read_hosts_file(path) is None
    write_hosts_file(path, {"a": 2}, discovery=True)
    assert read_hosts_file(path) == ({"a": 2}, True)


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return str(path)


def test_discovery_reads_host_and_host_slots_lines(tmp_path):
    script = _script(tmp_path, "echo a:2\necho b\necho\n")
    assert discover(script, slots_per_host=4) == [HostSlots("a", 2), HostSlots("b", 4)]
    assert discover(_script(tmp_path, "true\n"), 1) == []


@pytest.mark.parametrize("body,message", [("exit 3\n", "exited with 3"), ("echo 'a:x'\n", "slots for 'a'"),
                                          ("echo '-oProxy:1'\n", "bad host name")])
def test_a_failing_or_bad_discovery_script_is_named(tmp_path, body, message):
    with pytest.raises(DiscoveryError, match=message):
        discover(_script(tmp_path, body), 1)


def test_this_machine_is_published_under_its_host_name():
    import socket

    table = published([HostSlots("localhost", 2), HostSlots("127.0.0.1", 1), HostSlots("b", 1)])
    assert table == {socket.gethostname(): 3, "b": 1}


def test_no_rank_is_spawned_within_a_second_of_a_death_even_when_the_cooldown_is_over():
    book = HostBook(cooldown=(0.001, 0.001), hosts={"a": 3})
    book.record_failure("a", now=100)
    assert book.plan(["a", "a"], now=100.5) == Plan() and book.can_grow_later(now=100.5)
    assert book.plan(["a", "a"], now=101) == Plan(spawn=(("a", 1),))


def test_ready_spares_replace_the_plans_new_ranks_on_their_host_and_other_spawns_wait():
    plan = Plan(spawn=(("a", 2), ("b", 1)), remove=(3,))
    served, per_host = served_by_spares(plan, ready={"a": 1, "c": 1}, starting={})
    assert served == Plan(remove=(3,), admit=1) and per_host == {"a": 1} and served.new_ranks == 1
    assert served_by_spares(plan, ready={"a": 5}, starting={}) == (Plan(remove=(3,), admit=2), {"a": 2})
    # No ready spare where ranks are wanted: spawned as before, unless a spare is still starting.
    assert served_by_spares(plan, ready={"c": 1}, starting={}) == (plan, {})
    assert served_by_spares(plan, ready={}, starting={"c": 1}) == (Plan(remove=(3,)), {})
    assert served_by_spares(Plan(), ready={"a": 1}, starting={"a": 1}) == (Plan(), {})
    assert Plan(admit=1) and not Plan(warm=("a",))  # starting a spare is no world change


def test_new_ranks_without_a_ready_spare_start_as_spares_one_a_slot_and_change_nothing_yet():
    plan = Plan(spawn=(("a", 2), ("b", 1)), remove=(3,))
    started = as_spares(plan)
    assert started == Plan(remove=(3,), warm=("a", "a", "b"), deferred=3) and started.new_ranks == 0
    assert not as_spares(Plan(spawn=(("a", 1),)))  # the world trains on until the spare is ready
    # Once ready, the next commit's plan admits them (the spawns they serve are planned again).
    assert served_by_spares(plan, ready={"a": 2, "b": 1}, starting={}) == (Plan(remove=(3,), admit=3), {"a": 2, "b": 1})


def test_spares_go_to_the_usable_host_with_the_fewest_and_not_right_after_a_death():
    book = HostBook(cooldown=(0.001, 0.001), hosts={"a": 2, "b": 1, "c": 1})
    assert book.hosts_for_spares(3, {"a": 1}, now=0) == ("b", "c", "a")
    assert book.hosts_for_spares(0, {}, now=0) == () and book.hosts_for_spares(-1, {}, now=0) == ()
    book.record_failure("b", now=100)
    assert book.hosts_for_spares(1, {}, now=100.5) == ()
    assert book.hosts_for_spares(2, {}, now=101) == ("a", "b")  # b's cooldown is over
    assert HostBook().hosts_for_spares(1, {}, now=0) == ()  # no list published yet
