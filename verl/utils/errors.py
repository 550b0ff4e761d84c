"""Errors shared across the protocol, the single controller and the utilities."""

from __future__ import annotations

__all__ = ["InvalidDataError"]


class InvalidDataError(ValueError, AssertionError):
    """Inputs that an operation refuses: conflicting values for one key, row counts that do not divide, a batch
    layout it does not support, an empty list where items are needed.

    A ``ValueError``; also an ``AssertionError``, which is what veRL raises in these places (with ``assert``), so
    code written against veRL that catches ``AssertionError`` keeps working. Unlike an ``assert``, it is raised
    under ``python -O`` too.
    """
