"""Re-assembling per-rank output lines from Hydra's marked stream (see ``command.TAG_PATTERN``)."""

from __future__ import annotations

import re

_MARK = re.compile(rb"\x1e(\d+)\x1f")


class LineTagger:
    """Feed raw chunks; get back complete lines tagged ``[rank]: ``. Text outside marks passes as is."""

    def __init__(self) -> None:
        self._partial: dict[int, bytes] = {}
        self._rank: int | None = None

    def feed(self, chunk: bytes) -> bytes:
        out = []
        pieces = _MARK.split(chunk)
        # pieces: [text, rank, text, rank, text, ...]; text before the first mark belongs to the last rank seen
        self._take(pieces[0], out)
        for index in range(1, len(pieces), 2):
            self._rank = int(pieces[index])
            self._take(pieces[index + 1], out)
        return b"".join(out)

    def _take(self, text: bytes, out: list[bytes]) -> None:
        if not text:
            return
        if self._rank is None:
            out.append(text)  # mpiexec's own messages
            return
        buffered = self._partial.pop(self._rank, b"") + text
        *lines, rest = buffered.split(b"\n")
        out.extend(b"[%d]: %s\n" % (self._rank, line) for line in lines)
        if rest:
            self._partial[self._rank] = rest

    def flush(self) -> bytes:
        """Whatever is left (lines without a final newline)."""
        out = b"".join(b"[%d]: %s\n" % (rank, rest) for rank, rest in sorted(self._partial.items()))
        self._partial.clear()
        return out
