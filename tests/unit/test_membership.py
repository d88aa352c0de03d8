"""One agreed world per change, in process: hvdliterun's decider and its channel op, with threads as
survivors whose views of the dead differ and arrive in any order."""

import threading

import pytest
from hvdlite.runner.elastic.membership import Memberships
from hvdlite.runner.elastic.service import ElasticService

from hvdlite.elastic.agreement import Agreed, agree
from hvdlite.elastic.channel import ChannelError, request

MEMBERS = ["0", "1", "2", "g1.0", "g1.1"]


def _decider(exited: set[str] | None = None) -> Memberships:
    return Memberships(lambda members: set(exited or ()) & set(members))


def test_no_decision_while_a_member_is_neither_heard_from_nor_named_dead():
    decider = _decider()
    assert decider.propose("0.0", MEMBERS, "0", ["2"], [], 0.0) == (None, ["1", "g1.0", "g1.1"])
    assert decider.propose("0.0", MEMBERS, "1", ["2", "g1.1"], [], 0.0) == (None, ["g1.0"])


def test_every_survivor_gets_the_union_of_what_all_saw_whatever_the_order():
    decider = _decider()
    decider.propose("0.0", MEMBERS, "0", ["2"], [], 0.0)  # saw one death
    decider.propose("0.0", MEMBERS, "1", ["g1.1"], [], 0.0)  # saw the other
    decision, waiting = decider.propose("0.0", MEMBERS, "g1.0", [], [], 0.0)  # saw none yet
    assert waiting == [] and decision == Agreed(("2", "g1.1"), ("2", "g1.1"))
    # A late view, even one that grew since, gets the same decision: one world per change.
    assert decider.propose("0.0", MEMBERS, "0", ["2", "g1.0"], [], 0.0)[0] == decision


def test_the_launchers_own_knowledge_of_exits_counts_and_unreachable_members_are_not_exited():
    decider = _decider(exited={"g1.1"})
    decider.propose("1.0", MEMBERS, "0", [], ["2"], 0.0)
    decider.propose("1.0", MEMBERS, "1", [], [], 0.0)
    decision, _ = decider.propose("1.0", MEMBERS, "g1.0", [], [], 0.0)
    assert decision == Agreed(("2", "g1.1"), ("g1.1",))


def test_a_later_change_of_the_same_members_is_decided_anew():
    decider = _decider()
    for member in ("0", "1", "g1.0", "g1.1"):
        decider.propose("0.0", MEMBERS, member, ["2"], [], 0.0)
    decision, _ = decider.propose("0.1", MEMBERS, "0", [], [], 0.0)
    assert decision is None


def test_a_proposal_naming_a_stranger_is_refused():
    with pytest.raises(ValueError, match=r"process id\(s\) \['7'\] are not members"):
        _decider().propose("0.0", MEMBERS, "0", ["7"], [], 0.0)


def test_survivors_waiting_in_threads_all_return_the_same_decision_once_the_last_one_proposes():
    decider, decisions = _decider(), []
    views = {"0": ["2"], "1": ["2", "g1.1"], "g1.0": ["g1.1"]}
    threads = [threading.Thread(target=lambda m=m: decisions.append(decider.propose("0.0", MEMBERS, m, views[m],
                                                                                   [], 60.0)[0]))
               for m in views]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert decisions == [Agreed(("2", "g1.1"), ("2", "g1.1"))] * 3


@pytest.fixture
def service(tmp_path):
    running = ElasticService(str(tmp_path), "127.0.0.1", ["127.0.0.1"])
    yield running
    running.stop()


def test_ranks_agree_through_the_channel_and_an_exit_the_wrapper_reported_counts(service):
    request(service.address, service.token, {"op": "exited", "id": "2", "status": 137})
    results = {}
    threads = [threading.Thread(target=lambda m=m: results.__setitem__(
        m, agree(service.address, service.token, "0.0", ["0", "1", "2"], m, lambda: [], [], None)))
        for m in ("0", "1")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {"0": Agreed(("2",), ("2",)), "1": Agreed(("2",), ("2",))}


def test_a_member_that_never_answers_is_given_up_at_the_deadline(service):
    # Members "1" and "2" never propose and are never seen dead: after the deadline "0" names them.
    agreed = agree(service.address, service.token, "0.0", ["0", "1", "2"], "0", lambda: [], [], 0.05)
    assert agreed == Agreed(("1", "2"), ())


def test_without_the_launcher_a_rank_decides_alone():
    assert agree("127.0.0.1:9", "token", "0.0", ["0", "1"], "0", lambda: ["1"], [], None) is None


@pytest.mark.parametrize("message, problem", [
    ({"change": "0.0", "members": ["0", "1"], "id": "5", "exited": [], "unreachable": []}, "are not members"),
    ({"change": "0;0", "members": ["0", "1"], "id": "0", "exited": [], "unreachable": []}, "is not N.N"),
    ({"change": "0.0", "members": ["0", "../x"], "id": "0", "exited": [], "unreachable": []}, "is not N or gG.N"),
])
def test_bad_agree_requests_are_refused_with_the_reason(service, message, problem):
    with pytest.raises(ChannelError, match=problem):
        request(service.address, service.token, {"op": "agree", **message})
