"""The connections between the driver, the agent, the tasks and the ranks of a remote job.

``multiprocessing.connection`` over TCP: pickled messages, and a challenge on the job's random key
before anything is read, so nothing but the job's own processes can make a task run a command.
"""

from __future__ import annotations

from multiprocessing.connection import Client, Connection, Listener

Address = tuple[str, int]


def listen(host: str, key: bytes) -> Listener:
    """A listener on ``host`` (any free port) that only admits holders of ``key``."""
    return Listener((host, 0), authkey=key)


def connect(address: Address, key: bytes) -> Connection:
    """A connection to the listener at ``address``."""
    return Client(tuple(address), authkey=key)


def request(address: Address, key: bytes, message: tuple) -> object:
    """Send ``message`` and return the reply."""
    with connect(address, key) as connection:
        connection.send(message)
        return connection.recv()


def format_address(address: Address) -> str:
    return f"{address[0]}:{address[1]}"


def parse_address(text: str) -> Address:
    """``host:port`` as an address; a ValueError names the text that is not one."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{text!r} is not a host:port address")
    return host, int(port)
