"""The response cache and the bit vector that lets ranks agree on cached requests in one collective.

Every rank inserts the same responses in the same order and evicts identically, so a given
cache bit means the same request everywhere. In steady state (training: the same gradient names
every step) a cycle is one small bitwise-AND all-reduce instead of a coordinator round trip:

    [~or_flags, and_flags, ~invalid_bits..., hit_bits...]   64-bit words, reduced with BAND

Hit bits survive only if every rank has that request pending. The OR-sections are sent
inverted so one BAND computes "any rank" for them (de Morgan), as Horovod's cache does.
A rank that submits a cached name with a different signature sets the name's *invalid* bit;
every rank then evicts it and the request goes to the coordinator.
"""

from __future__ import annotations

import collections
import enum
import functools
import heapq
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from ..work.request import Request, RequestMeta
from ..work.response import Response

# Bits of the OR-section flags word.
HAS_NEW = 1  # some rank has requests the cache cannot answer: run a coordinator round
FLUSH = 2  # bypass the cache this cycle (a rank joined, is shutting down, or saw a stall)
ROUND_DUE = 4  # the coordinator has waiting names and wants a round for its stall inspector
TUNE = 8  # rank 0 has new autotuned settings to publish in a round
# Bits of the AND-section flags word.
SHUTDOWN = 1  # every rank asked to shut down
CARRIED = 2  # every rank's tensor rides with the vector (a lone small allreduce; see negotiate.agree_lone)


class Lookup(enum.Enum):
    HIT = "hit"
    INVALID = "invalid"
    MISS = "miss"


class ResponseCache:
    """LRU map ``name -> (bit, signature, response)`` with deterministic bit assignment."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.words = (capacity + 63) // 64
        # name -> (bit, signature, response), least recently used first. Read directly by the small-op
        # path (Negotiator.steady_exchange), where a method call is a tenth of the work.
        self.by_name: collections.OrderedDict[str, tuple[int, tuple, Response]] = collections.OrderedDict()
        self._name_of_bit: dict[int, str] = {}
        self._free_bits = list(range(capacity))  # a heap: the lowest free bit is reused first

    def __len__(self) -> int:
        return len(self.by_name)

    def lookup(self, meta: RequestMeta) -> tuple[Lookup, int]:
        entry = self.by_name.get(meta.name)
        if entry is None:
            return Lookup.MISS, -1
        bit, signature, _ = entry
        # A RequestMeta is its own signature (RequestMeta.signature): compared as it is, every cycle.
        return (Lookup.HIT if signature == meta else Lookup.INVALID), bit

    def put(self, response: Response, own: RequestMeta | None = None) -> None:
        """Remember a successful response; evicts the least recently used entry when full.

        ``own`` is this rank's request for the name: the entry is hit only when this rank submits
        it again. It can differ from the response's meta (one rank's) where ranks legitimately
        differ: an allgather's first dimension, an alltoall's splits. Keyed on another rank's
        request, a rank whose rows changed would hit an entry holding the old sizes.
        """
        if self.capacity == 0 or not response.cacheable:
            return
        name = response.meta.name
        if name in self.by_name:
            self.evict(self.by_name[name][0])
        if len(self.by_name) >= self.capacity:
            self.evict(next(iter(self.by_name.values()))[0])
        bit = heapq.heappop(self._free_bits)
        self.by_name[name] = (bit, (own if own is not None else response.meta).signature, response)
        self._name_of_bit[bit] = name

    def cycle_state(self, pending: Iterable[Request], flush: bool, or_flags: int, and_flags: int) -> CycleState:
        """This rank's contribution to a cycle: which pending requests hit the cache, which
        invalidate an entry, and HAS_NEW if any needs the coordinator (every one does on a flush)."""
        has_new, invalid, hits = False, set(), set()
        for request in pending:
            if request.sent_to_coordinator:
                continue
            found, bit = (Lookup.MISS, -1) if flush else self.lookup(request.meta)
            if found is Lookup.HIT:
                hits.add(bit)
            else:
                has_new = True
                if found is Lookup.INVALID:
                    invalid.add(bit)
        return CycleState(or_flags | (HAS_NEW if has_new else 0), and_flags, frozenset(invalid), frozenset(hits))

    def get(self, bit: int) -> Response:
        """The response behind ``bit``, marked most recently used."""
        name = self._name_of_bit[bit]
        self.by_name.move_to_end(name)
        return self.by_name[name][2]

    def evict(self, bit: int) -> None:
        name = self._name_of_bit.pop(bit, None)
        if name is not None:
            del self.by_name[name]
            heapq.heappush(self._free_bits, bit)


class CycleState(NamedTuple):
    """One rank's contribution to a cycle, or (after the reduction) the whole job's verdict.

    A tuple, built twice every cycle: a frozen dataclass's ``__init__`` was measured at ~2 us.
    """

    or_flags: int = 0
    and_flags: int = 0
    invalid: frozenset[int] = frozenset()
    hits: frozenset[int] = frozenset()


_NONE: frozenset[int] = frozenset()
_new_state = functools.partial(tuple.__new__, CycleState)  # skips NamedTuple's Python-level __new__ (0.6 us)
_MASK64 = (1 << 64) - 1


# Bit sets travel as Python ints and the vector as bytes (reduced as MPI_BYTE with BAND): building
# and reading it this way takes about a microsecond each, against several for a NumPy vector, and
# it runs twice every cycle, including the one cycle of every blocking call.
def _bits_to_int(bits: frozenset[int]) -> int:
    value = 0
    for bit in bits:
        value |= 1 << bit
    return value


def _int_to_bits(value: int) -> frozenset[int]:
    if not value:
        return _NONE
    bits = []
    while value:
        lowest = value & -value
        bits.append(lowest.bit_length() - 1)
        value ^= lowest
    return frozenset(bits)


def encode(state: CycleState, words: int) -> bytes:
    """The bytes this rank contributes to the cycle's BAND all-reduce (``8 * (2 + 2 * words)`` of them)."""
    width = 8 * words
    # OR through a BAND: send the complement (all ones when nothing is invalid, the common case).
    invalid = (~_bits_to_int(state.invalid) & ((1 << (64 * words)) - 1)).to_bytes(width, "little")
    return b"".join(((~state.or_flags & _MASK64).to_bytes(8, "little"), state.and_flags.to_bytes(8, "little"),
                     invalid, _bits_to_int(state.hits).to_bytes(width, "little")))


def decode(vector: bytes | bytearray, words: int) -> CycleState:
    """Read the reduced vector back: OR of or_flags/invalid, AND of and_flags/hits."""
    width = 8 * words
    invalid = ((1 << (64 * words)) - 1) ^ int.from_bytes(vector[16 : 16 + width], "little")
    hits = int.from_bytes(vector[16 + width :], "little") & ~invalid  # an invalidated entry is no hit
    return _new_state((~int.from_bytes(vector[:8], "little") & _MASK64, int.from_bytes(vector[8:16], "little"),
                       _int_to_bits(invalid), _int_to_bits(hits)))


def band(vectors: list[bytes]) -> bytes:
    """In-process BAND of several ranks' vectors (what MPI computes; used by unit tests)."""
    return np.bitwise_and.reduce(np.stack([np.frombuffer(v, np.uint8) for v in vectors]), axis=0).tobytes()
