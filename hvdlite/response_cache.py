"""The response cache and the bit vector that lets ranks agree on cached requests in one collective.

Every rank inserts the same responses in the same order and evicts identically, so a given
cache bit means the same request everywhere. In steady state (training: the same gradient names
every step) a cycle is one small bitwise-AND all-reduce instead of a coordinator round trip:

    [~or_flags, and_flags, ~invalid_bits..., hit_bits...]   reduced with BAND

Hit bits survive only if every rank has that request pending. The OR-sections are sent
inverted so one BAND computes "any rank" for them (de Morgan), as Horovod's cache does.
A rank that submits a cached name with a different signature sets the name's *invalid* bit;
every rank then evicts it and the request goes to the coordinator.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import heapq
from collections.abc import Iterable

import numpy as np

from .request import Request, RequestMeta
from .response import Response

# Bits of the OR-section flags word.
HAS_NEW = 1  # some rank has requests the cache cannot answer: run a coordinator round
FLUSH = 2  # bypass the cache this cycle (a rank joined, is shutting down, or saw a stall)
ROUND_DUE = 4  # the coordinator has waiting names and wants a round for its stall inspector
TUNE = 8  # rank 0 has new autotuned settings to publish in a round
# Bits of the AND-section flags word.
SHUTDOWN = 1  # every rank asked to shut down

_ALL_ONES = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


class Lookup(enum.Enum):
    HIT = "hit"
    INVALID = "invalid"
    MISS = "miss"


class ResponseCache:
    """LRU map ``name -> (bit, signature, response)`` with deterministic bit assignment."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.words = (capacity + 63) // 64
        self._by_name: collections.OrderedDict[str, tuple[int, tuple, Response]] = collections.OrderedDict()
        self._name_of_bit: dict[int, str] = {}
        self._free_bits = list(range(capacity))  # a heap: the lowest free bit is reused first

    def __len__(self) -> int:
        return len(self._by_name)

    def lookup(self, meta: RequestMeta) -> tuple[Lookup, int]:
        entry = self._by_name.get(meta.name)
        if entry is None:
            return Lookup.MISS, -1
        bit, signature, _ = entry
        return (Lookup.HIT if signature == meta.signature else Lookup.INVALID), bit

    def put(self, response: Response) -> None:
        """Remember a successful response; evicts the least recently used entry when full."""
        if self.capacity == 0 or not response.cacheable:
            return
        name = response.meta.name
        if name in self._by_name:
            self.evict(self._by_name[name][0])
        if len(self._by_name) >= self.capacity:
            self.evict(next(iter(self._by_name.values()))[0])
        bit = heapq.heappop(self._free_bits)
        self._by_name[name] = (bit, response.meta.signature, response)
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
        self._by_name.move_to_end(name)
        return self._by_name[name][2]

    def evict(self, bit: int) -> None:
        name = self._name_of_bit.pop(bit, None)
        if name is not None:
            del self._by_name[name]
            heapq.heappush(self._free_bits, bit)


@dataclasses.dataclass(frozen=True)
class CycleState:
    """One rank's contribution to a cycle, or (after the reduction) the whole job's verdict."""

    or_flags: int = 0
    and_flags: int = 0
    invalid: frozenset[int] = frozenset()
    hits: frozenset[int] = frozenset()


# Bit sets travel as Python ints: building and reading a 1024-bit set this way takes a few
# microseconds, against tens for NumPy's packbits/unpackbits, and it runs twice every cycle.
def _bits_to_int(bits: frozenset[int]) -> int:
    value = 0
    for bit in bits:
        value |= 1 << bit
    return value


def _int_to_bits(value: int) -> frozenset[int]:
    bits = []
    while value:
        lowest = value & -value
        bits.append(lowest.bit_length() - 1)
        value ^= lowest
    return frozenset(bits)


def encode(state: CycleState, words: int) -> np.ndarray:
    """The uint64 vector this rank contributes to the cycle's BAND all-reduce."""
    width = 8 * words
    every = (1 << (64 * words)) - 1
    invalid = every ^ _bits_to_int(state.invalid)  # OR through a BAND: send the complement
    payload = invalid.to_bytes(width, "little") + _bits_to_int(state.hits).to_bytes(width, "little")
    vector = np.empty(2 + 2 * words, dtype=np.uint64)
    vector[0] = ~np.uint64(state.or_flags)
    vector[1] = state.and_flags
    vector[2:] = np.frombuffer(payload, dtype=np.uint64)
    return vector


def decode(vector: np.ndarray, words: int) -> CycleState:
    """Read the reduced vector back: OR of or_flags/invalid, AND of and_flags/hits."""
    every = (1 << (64 * words)) - 1
    invalid = _int_to_bits(every ^ int.from_bytes(vector[2 : 2 + words].tobytes(), "little"))
    hits = _int_to_bits(int.from_bytes(vector[2 + words :].tobytes(), "little"))
    return CycleState(int(~vector[0] & _ALL_ONES), int(vector[1]), invalid, hits - invalid)


def band(vectors: list[np.ndarray]) -> np.ndarray:
    """In-process BAND of several ranks' vectors (what MPI computes; used by unit tests)."""
    return np.bitwise_and.reduce(np.stack(vectors), axis=0)
