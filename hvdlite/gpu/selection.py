"""Which data plane runs device tensors: NCCL on the device, or host-staged MPI. Pure logic.

Every rank must choose the same plane, so the choice is a function of a table every rank holds:
each rank's NCCL version (0 if NCCL does not load), whether it asked for MPI
(``HVDLITE_GPU_OPERATIONS=MPI``), whether it enabled ``NCCL_MULTI_RANK_GPU_ENABLE``, and which
physical GPU it uses. NCCL refuses two ranks of one communicator on the same GPU unless
``NCCL_MULTI_RANK_GPU_ENABLE=1`` (experimental, NCCL >= 2.30); such jobs use the host-staged path.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

MULTI_RANK_GPU_MIN_NCCL = 23000  # NCCL 2.30.0, the first with NCCL_MULTI_RANK_GPU_ENABLE
PLANE_NCCL = "NCCL"
PLANE_MPI = "MPI"
ROW_FIELDS = 4  # int64 fields per rank in the exchanged table


@dataclasses.dataclass(frozen=True)
class RankGpu:
    """One rank's row of the table the choice is made from."""

    nccl_version: int
    wants_mpi: bool
    multi_rank_enabled: bool
    gpu_key: int  # a stable hash of (host name, PCI bus id): equal keys mean the same physical GPU

    def encode(self) -> np.ndarray:
        return np.array([self.nccl_version, self.wants_mpi, self.multi_rank_enabled, self.gpu_key], dtype=np.int64)

    @classmethod
    def decode(cls, row: np.ndarray) -> RankGpu:
        version, wants_mpi, multi, key = (int(v) for v in row)
        return cls(version, bool(wants_mpi), bool(multi), key)


@dataclasses.dataclass(frozen=True)
class Choice:
    plane: str  # PLANE_NCCL or PLANE_MPI
    reason: str


def gpu_key(host: str, pci_bus_id: str) -> int:
    """A hash of where a GPU is that every process computes alike (Python's ``hash`` of a str does not)."""
    digest = hashlib.sha256(f"{host}/{pci_bus_id.lower()}".encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def choose_plane(table: list[RankGpu]) -> Choice:
    """The plane for the whole job, and why, from every rank's row (index = rank)."""
    asked = [r for r, row in enumerate(table) if row.wants_mpi]
    if asked:
        return Choice(PLANE_MPI, f"HVDLITE_GPU_OPERATIONS=MPI on rank(s) {asked}")
    missing = [r for r, row in enumerate(table) if row.nccl_version == 0]
    if missing:
        return Choice(PLANE_MPI, f"NCCL does not load on rank(s) {missing} (pip install 'hvdlite[gpu]')")
    sharing: dict[int, list[int]] = {}
    for rank, row in enumerate(table):
        sharing.setdefault(row.gpu_key, []).append(rank)
    shared = [ranks for ranks in sharing.values() if len(ranks) > 1]
    version = min(row.nccl_version for row in table)
    if shared:
        groups = "; ".join(f"ranks {ranks} share one GPU" for ranks in shared)
        if not all(row.multi_rank_enabled for row in table):
            return Choice(PLANE_MPI, f"{groups}, which NCCL allows only with NCCL_MULTI_RANK_GPU_ENABLE=1 "
                                     f"(experimental, NCCL >= 2.30) on every rank")
        if version < MULTI_RANK_GPU_MIN_NCCL:
            return Choice(PLANE_MPI, f"{groups}; NCCL_MULTI_RANK_GPU_ENABLE needs NCCL >= 2.30, this job has "
                                     f"{format_version(version)}")
        return Choice(PLANE_NCCL, f"NCCL {format_version(version)}, several ranks per GPU "
                                  "(NCCL_MULTI_RANK_GPU_ENABLE=1, experimental)")
    return Choice(PLANE_NCCL, f"NCCL {format_version(version)}, one GPU per rank")


def format_version(code: int) -> str:
    """NCCL's integer version (2.32.3 -> 23203) as text."""
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
