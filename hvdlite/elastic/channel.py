"""The elastic job's control channel: ranks talk to ``hvdliterun`` over TCP, wherever it runs.

hvdliterun keeps the job's bookkeeping in its run directory (the host list, the ranks started,
their exit statuses, the ranks the job went on without). Ranks on its host could use that
directory directly, but a launcher on a login node or in a Kubernetes launcher pod shares no file
system with them, so in elastic mode every rank reports through this channel instead
(``runner/elastic/service.py`` is the other end): one request per connection, one JSON line each
way, carrying the job's token (``HVDLITE_ELASTIC_TOKEN``, a random secret hvdliterun makes for
the job and forwards to its ranks like every other variable).

Standard library only: the rank wrapper runs this file as a script to report a rank's exit
status (``python -I channel.py exited SERVICE PROCESS_ID STATUS``, the token on stdin),
and a script started by path must not import hvdlite, numpy and the rest.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

CONNECT_SECONDS = 2.0  # per published address: a launcher behind a dead link must not hold a rank long
REPLY_SECONDS = 5.0


class ChannelError(OSError):
    """hvdliterun could not be reached, or refused the request; the message says which and why."""


def addresses(service: str) -> list[tuple[str, int]]:
    """``HOST:PORT[,HOST:PORT...]`` (hvdliterun publishes every address it may be reached at)."""
    found = []
    for item in service.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ChannelError(f"elastic service address {item!r} is not HOST:PORT")
        found.append((host, int(port)))
    return found


def request(service: str, token: str, message: dict[str, Any]) -> dict[str, Any]:
    """Send ``message`` to hvdliterun and return its reply; tries each published address in turn."""
    problems = []
    for host, port in addresses(service):
        try:
            with socket.create_connection((host, port), timeout=CONNECT_SECONDS) as connection:
                connection.settimeout(REPLY_SECONDS)
                connection.sendall((json.dumps({**message, "token": token}) + "\n").encode())
                reply = json.loads(_read_line(connection) or "{}")
        except (OSError, ValueError) as exc:
            problems.append(f"{host}:{port}: {exc}")
            continue
        if "error" in reply:
            raise ChannelError(f"hvdliterun refused {message.get('op')!r}: {reply['error']}")
        return reply
    raise ChannelError(f"hvdliterun's elastic service is unreachable ({'; '.join(problems)})")


def _read_line(connection: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode()


def main(argv: list[str]) -> int:
    """``exited SERVICE PROCESS_ID STATUS`` with the token on stdin: the rank wrapper's report."""
    if len(argv) != 4 or argv[0] != "exited":
        print("usage: channel.py exited SERVICE PROCESS_ID STATUS (token on stdin)", file=sys.stderr)
        return 2
    _, service, process_id, status = argv
    try:
        request(service, sys.stdin.read().strip(), {"op": "exited", "id": process_id, "status": int(status)})
    except (ChannelError, ValueError) as exc:
        print(f"hvdlite rank {process_id}: could not report its exit status {status}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
