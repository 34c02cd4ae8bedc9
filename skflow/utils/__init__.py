"""Helpers every subsystem shares (files written whole, names, what the estimators share); nothing in here imports
another skflow subsystem but :mod:`skflow.metrics`. Each module's ``__all__`` says what it offers."""

from skflow.utils import _estimators, _files, _names, _state
from skflow.utils._estimators import *  # noqa: F403
from skflow.utils._files import *  # noqa: F403
from skflow.utils._names import *  # noqa: F403
from skflow.utils._state import *  # noqa: F403

__all__ = [*_estimators.__all__, *_files.__all__, *_names.__all__, *_state.__all__]
