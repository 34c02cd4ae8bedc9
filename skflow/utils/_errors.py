"""Errors about saved models, shared by every subsystem that reads one."""


class InvalidModelError(ValueError):
    """A saved model whose state is inconsistent or not what skflow writes."""


class UntrustedTypeError(InvalidModelError):
    """The file holds a type that skflow does not trust; nothing in it was built."""
