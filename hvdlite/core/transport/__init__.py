"""Transports: MPI (and shared memory inside one host) under the negotiation and the host data plane."""

from .base import ControlChannel, Transport

__all__ = ["ControlChannel", "Transport"]
