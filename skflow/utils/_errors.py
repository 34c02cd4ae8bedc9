"""Errors about saved models, shared by every subsystem that reads one."""


class InvalidModelError(ValueError):
    """A saved model whose state is inconsistent or not what skflow writes."""

    __module__ = "skflow.persistence"  # where users import it from, and what tracebacks show


class UntrustedTypeError(InvalidModelError):
    """The file holds a type that skflow does not trust; nothing in it was built."""

    __module__ = "skflow.persistence"
