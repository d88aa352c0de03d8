"""hvdliterun's elastic control channel, in process: the service, the ranks' client, hostile requests."""

import json
import os
import socket

import pytest
from hvdlite.runner.elastic.service import ElasticService, interface_address, service_addresses
from hvdlite.runner.process import read_pid_files

from hvdlite.elastic.channel import ChannelError, addresses, request
from hvdlite.elastic.hosts import HOSTS_FILE, write_hosts_file


@pytest.fixture
def service(tmp_path):
    running = ElasticService(str(tmp_path), "127.0.0.1", ["127.0.0.1"])
    yield running
    running.stop()


def _ask(service: ElasticService, message: dict, token: str | None = None) -> dict:
    return request(service.address, service.token if token is None else token, message)


def test_rank_0_gets_the_launchers_current_host_list(service, tmp_path):
    assert _ask(service, {"op": "hosts"}) == {"hosts": None}  # not published yet
    write_hosts_file(str(tmp_path / HOSTS_FILE), {"hostA": 2, "hostB": 1}, discovery=True)
    assert _ask(service, {"op": "hosts"}) == {"hosts": {"hostA": 2, "hostB": 1}, "discovery": True}


def test_reports_become_the_run_directorys_files_the_launcher_reads(service, tmp_path):
    _ask(service, {"op": "started", "id": "g1.0", "pid": 4242, "host": "node-7.cluster"})
    _ask(service, {"op": "started", "id": "3", "pid": 99, "host": "node-8"})
    assert read_pid_files(str(tmp_path)) == {"g1.0": (4242, "node-7.cluster"), 3: (99, "node-8")}
    _ask(service, {"op": "exited", "id": "3", "status": 137})
    assert (tmp_path / "rank.3.status").read_text().strip() == "137"
    _ask(service, {"op": "removed", "ids": ["3"]})
    _ask(service, {"op": "removed", "ids": ["g1.0"]})
    assert (tmp_path / "elastic.removed").read_text().split() == ["3", "g1.0"]
    assert _ask(service, {"op": "gone", "ids": ["g1.0", "3", "7"]}) == {"exited": ["3"]}  # a spare asks after rank 0
    _ask(service, {"op": "spare", "id": "g2.0"})
    _ask(service, {"op": "spare", "id": "g3.0", "abandoned": True})  # its spawn failed: the spare ends itself
    assert (tmp_path / "rank.g2.0.spare").exists() and (tmp_path / "rank.g3.0.abandoned").exists()
    assert _ask(service, {"op": "gone", "ids": ["g2.0", "g3.0"]}) == {"exited": ["g3.0"]}


def test_a_request_without_the_jobs_token_changes_nothing(service, tmp_path):
    with pytest.raises(ChannelError, match="hvdliterun refused 'exited': wrong or missing token"):
        _ask(service, {"op": "exited", "id": "0", "status": 0}, token="guess")
    with pytest.raises(ChannelError, match="wrong or missing token"):
        _ask(service, {"op": "hosts"}, token="")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("message, problem", [
    ({"op": "exited", "id": "../../etc/passwd", "status": 0}, "process id '../../etc/passwd' is not N or gG.N"),
    ({"op": "exited", "id": "1/../../x", "status": 0}, "is not N or gG.N"),
    ({"op": "exited", "id": 1, "status": 0}, "process id 1 is not N or gG.N"),
    ({"op": "exited", "id": "1", "status": "0; rm -rf /"}, "invalid literal"),
    ({"op": "started", "id": "1", "pid": 5, "host": "evil\nhost"}, "pid 5 on host 'evil\\nhost'"),
    ({"op": "started", "id": "1", "pid": 5, "host": "-oProxyCommand=x"}, "on host '-oProxyCommand=x'"),
    ({"op": "started", "id": "1", "pid": -1, "host": "node"}, "pid -1"),
    ({"op": "removed", "ids": ["2", "rank.2.pid"]}, "process id 'rank.2.pid'"),
    ({"op": "started", "id": "1"}, "'pid'"),
    ({"op": "shutdown"}, "unknown op 'shutdown'"),
])
def test_hostile_or_malformed_requests_are_refused_by_name_and_write_nothing(service, tmp_path, message, problem):
    with pytest.raises(ChannelError, match="hvdliterun refused") as refused:
        _ask(service, message)
    assert problem in str(refused.value)
    assert os.listdir(tmp_path) == []


def test_a_line_that_is_not_json_gets_an_error_reply(service):
    host, port = addresses(service.address)[0]
    with socket.create_connection((host, port), timeout=5) as connection:
        connection.sendall(b"\x00\xffnot json\n")
        reply = json.loads(connection.makefile().readline())
    assert reply["error"].startswith("malformed request")


def test_an_unreachable_launcher_is_reported_with_every_address_tried():
    with socket.socket() as placeholder:  # a port nobody listens on once closed
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    with pytest.raises(ChannelError, match=rf"unreachable \(127.0.0.1:{port}: .*refused"):
        request(f"127.0.0.1:{port}", "token", {"op": "hosts"})
    with pytest.raises(ChannelError, match="'nohost' is not HOST:PORT"):
        addresses("127.0.0.1:1,nohost")


def test_the_service_listens_where_the_ranks_can_reach_it():
    assert service_addresses(True, "") == ("127.0.0.1", ["127.0.0.1"])
    assert service_addresses(False, "lo") == ("127.0.0.1", ["127.0.0.1"])  # --network-interface: only there
    bind, published = service_addresses(False, "")
    assert bind == "0.0.0.0" and published and all(not a.startswith("127.") for a in published[:-1])
    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(OSError, match="network interface 'nosuch0' has no IPv4 address here"):
        interface_address("nosuch0")


def test_rank_0_does_not_wait_for_an_unreachable_launcher_at_every_commit(monkeypatch):
    import types

    from hvdlite.core import runtime
    from hvdlite.elastic import reform
    from hvdlite.elastic.hosts import HostBook
    from hvdlite.settings.config import Config

    asked = []

    def unreachable(*_args):
        asked.append(1)
        raise ChannelError("hvdliterun's elastic service is unreachable (test)")

    fake = types.SimpleNamespace(config=Config(elastic_min_np=1, elastic_service="127.0.0.1:1"),
                                 topology=types.SimpleNamespace(rank=0), hosts=("a",), slot_hosts=("a",),
                                 book=HostBook(hosts={"a": 1}))
    monkeypatch.setattr(runtime, "current", lambda: fake)
    monkeypatch.setattr(reform, "request", unreachable)
    assert not reform.propose() and not reform.propose()  # the hosts stay as they are
    assert len(asked) == 1 and fake.book.ask_launcher_after > 0  # asked once, then backs off
