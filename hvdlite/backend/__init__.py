"""Data-plane backends. The engine asks each in turn; the first that is enabled for a buffer runs it."""

from .base import ControlChannel, DataBackend

__all__ = ["ControlChannel", "DataBackend"]
