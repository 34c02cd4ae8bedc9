"""Errors shared by every subsystem: saved models that cannot be trusted, outputs that must not be written."""


class InvalidModelError(ValueError):
    """A saved model whose state is inconsistent or not what skflow writes."""

    __module__ = "skflow.persistence"  # where users import it from, and what tracebacks show


class UntrustedTypeError(InvalidModelError):
    """The file holds a type that skflow does not trust; nothing in it was built."""

    __module__ = "skflow.persistence"


class OutputPathError(ValueError):
    """An output path that cannot or must not be written: found before any work is done, or at the write."""
