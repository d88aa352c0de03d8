"""hvdliterun's end of the elastic control channel (``hvdlite/elastic/channel.py`` is the ranks').

Ranks anywhere reach the launcher here, so the job's bookkeeping works without a file system
shared with the launcher: rank 0 asks for the host list at each commit and reports the ranks the
job went on without, every rank reports that it started (pid and host), and every rank's wrapper
reports its exit status. The service keeps all of it as the files of the run directory that the
launcher's watch already reads, so a local job and a remote one are decided the same way.

Every request must carry the job's token (a random secret made here); ids, pids, host names and
statuses are checked before they name a file. The channel is a trust boundary only against
processes that do not know the token: see the README's "Trust model".
"""

from __future__ import annotations

import fcntl
import hmac
import json
import os
import re
import secrets
import socket
import socketserver
import struct
import threading
from typing import Any

from hvdlite.elastic.hosts import HOSTS_FILE, read_hosts_file
from hvdlite.elastic.spares import abandoned_marker, exited, spare_marker
from hvdlite.utils.failed_peers import exited_members

from .membership import Memberships

_PROCESS_ID = re.compile(r"(g\d{1,9}\.)?\d{1,9}")  # a launched rank (N) or one the job spawned (gG.N)
_CHANGE = re.compile(r"\d{1,9}\.\d{1,9}")  # the job's count of re-forms and the round of this one
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_SIOCGIFADDR = 0x8915
_LINE_LIMIT = 1 << 16
# One "agree" request waits this long for the decision, then the rank asks again with what it sees by then.
_AGREE_WAIT_SECONDS = 0.02


class ElasticService:
    """A TCP service in a thread of hvdliterun; :meth:`environment` tells the ranks where it is."""

    def __init__(self, run_dir: str, bind_host: str, published: list[str]) -> None:
        self.token = secrets.token_hex(16)
        book = _Bookkeeper(run_dir, self.token)

        class Handler(socketserver.StreamRequestHandler):
            timeout = 10.0  # a peer that connects and says nothing must not hold a thread

            def handle(self) -> None:
                line = self.rfile.readline(_LINE_LIMIT)
                self.wfile.write((json.dumps(book.answer(line)) + "\n").encode())

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer((bind_host, 0), Handler)
        self._server.daemon_threads = True
        port = self._server.server_address[1]
        self.address = ",".join(f"{host}:{port}" for host in published)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,), daemon=True)
        self._thread.start()

    def environment(self) -> dict[str, str]:
        """The variables that bring the ranks (and their wrappers) to this service."""
        return {"HVDLITE_ELASTIC_SERVICE": self.address, "HVDLITE_ELASTIC_TOKEN": self.token}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Bookkeeper:
    """Answers one request line; writes what it is told into the run directory."""

    def __init__(self, run_dir: str, token: str) -> None:
        self._run_dir, self._token = run_dir, token
        self._lock = threading.Lock()
        self._memberships = Memberships(lambda members: exited_members(run_dir, members))

    def answer(self, line: bytes) -> dict[str, Any]:
        try:
            message = json.loads(line)
            if not isinstance(message, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            return {"error": f"malformed request: {exc}"}
        if not hmac.compare_digest(str(message.get("token", "")), self._token):
            return {"error": "wrong or missing token"}
        handler = {"hosts": self._hosts, "started": self._started, "exited": self._exited,
                   "removed": self._removed, "gone": self._gone,
                   "spare": self._spare}.get(message.get("op"))
        if handler is None and message.get("op") != "agree":
            return {"error": f"unknown op {message.get('op')!r}"}
        try:
            if handler is None:  # waits for the other survivors: must not hold the lock
                return self._agree(message)
            with self._lock:
                return handler(message)
        except (KeyError, TypeError, ValueError) as exc:
            return {"error": f"bad {message['op']!r} request: {exc}"}

    def _hosts(self, _message: dict[str, Any]) -> dict[str, Any]:
        found = read_hosts_file(os.path.join(self._run_dir, HOSTS_FILE))
        return {"hosts": None} if found is None else {"hosts": found[0], "discovery": found[1]}

    def _started(self, message: dict[str, Any]) -> dict[str, Any]:
        process_id, pid, host = _process_id(message["id"]), int(message["pid"]), str(message["host"])
        if not _HOST_NAME.fullmatch(host) or pid <= 0:
            raise ValueError(f"pid {pid} on host {host!r}")
        self._write(f"rank.{process_id}.pid", f"{pid} {host}")
        return {}

    def _exited(self, message: dict[str, Any]) -> dict[str, Any]:
        self._write(f"rank.{_process_id(message['id'])}.status", f"{int(message['status'])}\n")
        return {}

    def _removed(self, message: dict[str, Any]) -> dict[str, Any]:
        ids = [_process_id(process_id) for process_id in message["ids"]]
        with open(os.path.join(self._run_dir, "elastic.removed"), "a") as handle:
            handle.write("".join(f"{process_id}\n" for process_id in ids))
        return {}

    def _spare(self, message: dict[str, Any]) -> dict[str, Any]:
        """Rank 0 starts a warm spare: not a rank of the job until it is admitted (and announces itself);
        or gives one up (``abandoned``: its spawn failed, though its process may run)."""
        process_id = _process_id(message["id"])
        self._write((abandoned_marker if message.get("abandoned") else spare_marker)(process_id), "")
        return {}

    def _gone(self, message: dict[str, Any]) -> dict[str, Any]:
        """Which of the given processes have exited or were abandoned (a warm spare asks after the rank
        that started it, and after itself)."""
        return {"exited": sorted(exited(self._run_dir, "", "", [_process_id(i) for i in message["ids"]]))}

    def _agree(self, message: dict[str, Any]) -> dict[str, Any]:
        """A survivor's view of a failed world; the agreed decision once there is one (else None)."""
        members = [_process_id(member) for member in message["members"]]
        exited = [_process_id(member) for member in message["exited"]]
        unreachable = [_process_id(member) for member in message["unreachable"]]
        change = str(message["change"])
        if not _CHANGE.fullmatch(change):
            raise ValueError(f"change {change!r} is not N.N")
        decision, waiting = self._memberships.propose(change, members, _process_id(message["id"]), exited,
                                                      unreachable, _AGREE_WAIT_SECONDS)
        if decision is None:
            return {"dead": None, "waiting_for": waiting}
        return {"dead": list(decision.dead), "exited": list(decision.exited)}

    def _write(self, name: str, text: str) -> None:
        path = os.path.join(self._run_dir, name)
        with open(path + ".tmp", "w") as handle:
            handle.write(text)
        os.replace(path + ".tmp", path)


def _process_id(value: object) -> str:
    if not isinstance(value, str) or not _PROCESS_ID.fullmatch(value):
        raise ValueError(f"process id {value!r} is not N or gG.N")
    return value


def service_addresses(all_local: bool, interface: str) -> tuple[str, list[str]]:
    """(address to bind, addresses to publish): loopback for a one-host job, the ``--network-interface``'s
    address when given (the traffic stays on it), else every IPv4 address of this host."""
    if all_local:
        return "127.0.0.1", ["127.0.0.1"]
    if interface:
        address = interface_address(interface)
        return address, [address]
    found = [address for _, name in socket.if_nameindex() if (address := _address_or_none(name))
             and not address.startswith("127.")]
    return "0.0.0.0", found or [socket.gethostbyname(socket.gethostname())]


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (Linux)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        except OSError as exc:
            raise OSError(f"network interface {name!r} has no IPv4 address here: {exc.strerror}") from None
    return socket.inet_ntoa(packed[20:24])


def _address_or_none(name: str) -> str | None:
    try:
        return interface_address(name)
    except OSError:
        return None
