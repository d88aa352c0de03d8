"""The survivors' side of one agreed world per change (``runner/elastic/membership.py`` decides).

Each survivor of a failed world sends hvdliterun what it sees dead and gets back the launcher's one
decision for that world, the same for every survivor however the deaths became visible to each of
them. A member that neither proposes nor is seen dead is waited for until the communication
deadline (``--comm-timeout-seconds``); then it is proposed as unreachable, so a rank stuck outside
hvdlite cannot hold the others for ever.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from .channel import ChannelError, request

log = logging.getLogger("hvdlite")


@dataclasses.dataclass(frozen=True)
class Agreed:
    """The members of the old world that do not go on; ``exited`` of them are known to have exited."""

    dead: tuple[str, ...]
    exited: tuple[str, ...]


def agree(service: str, token: str, change: str, members: Sequence[str], me: str,
          read_exited: Callable[[], list[str]], unreachable: Sequence[str],
          deadline_seconds: float | None) -> Agreed | None:
    """hvdliterun's decision for the world ``members`` after a failure; None when it cannot be reached.

    ``change``: names this change (the same on every member: the job's count of re-forms and the
    round), so a later change of a world with the same members is decided anew.
    ``read_exited()``: the members this rank sees exited now (read again before each request, so a
    death that becomes visible while waiting is proposed too); ``unreachable``: those this rank's
    deadline probe could not reach.
    """
    give_up_at = time.monotonic() + deadline_seconds if deadline_seconds else None
    given_up: list[str] = []
    while True:
        try:
            reply = request(service, token, {"op": "agree", "change": change, "members": list(members), "id": me,
                                             "exited": read_exited(), "unreachable": [*unreachable, *given_up]})
        except ChannelError as exc:
            log.warning("could not agree on the new world with hvdliterun, so this rank decides from what it "
                        "sees itself: %s", exc)
            return None
        if reply.get("dead") is not None:
            return Agreed(tuple(reply["dead"]), tuple(reply["exited"]))
        if give_up_at is not None and time.monotonic() > give_up_at and not given_up:
            given_up = list(reply.get("waiting_for", []))
            log.warning("rank(s) %s neither re-formed nor died within the communication deadline: the job goes "
                        "on without them", given_up)
