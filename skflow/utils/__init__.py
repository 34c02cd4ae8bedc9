"""Plumbing every subsystem shares: files written whole, names and numbers a user gives, chunks of rows, the device
and torch's threads. A leaf: nothing in here imports another skflow module (what estimators share is
:mod:`skflow.base`). Each module's ``__all__`` says what it offers."""

from skflow.utils import _files, _names, _runtime
from skflow.utils._files import *  # noqa: F403
from skflow.utils._names import *  # noqa: F403
from skflow.utils._runtime import *  # noqa: F403

__all__ = [*_files.__all__, *_names.__all__, *_runtime.__all__]
