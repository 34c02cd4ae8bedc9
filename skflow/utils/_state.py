"""Restored state checked before it is used: a saved estimator may be somebody else's file.

An estimator with `CheckedStateMixin` declares its fitted attributes in a table, ``_FITTED`` (or
``_fitted_spec(state)`` where they depend on its parameters), and ``__setstate__`` (pickle, joblib, skops) refuses
a state that does not match it with an `InvalidModelError`.
"""

from numbers import Integral

import numpy as np

from skflow.utils._files import InvalidModelError

__all__ = ["CheckedStateMixin", "check_feature_names"]

OPTIONAL = ("feature_names_in_", "_sklearn_output_config", "_sklearn_auto_wrap_output_keys")


def check_feature_names(state: dict) -> None:
    """Refuse a saved state whose ``feature_names_in_`` is not None or an array of ``n_features_in_`` strings."""
    names = state.get("feature_names_in_")
    if names is not None and not (isinstance(names, np.ndarray) and names.shape == (state.get("n_features_in_"),)
                                  and all(isinstance(name, str) for name in names)):
        raise InvalidModelError("feature_names_in_ must be an array of n_features_in_ strings")


class CheckedStateMixin:
    """``__setstate__`` that checks the state against ``_FITTED`` and ``_check_fitted`` first.

    ``_FITTED`` maps each fitted attribute to what a restored state must hold there, in the order checked: a shape
    (a float64, finite array; a size is a number, a fitted int named before it, or set by the first array that has
    it), or a number type with bounds (a fitted int named before it, or None: unbounded).
    """

    _FITTED: dict = {}

    def _fitted_spec(self, state: dict) -> dict:
        """The table of fitted attributes for ``state`` (one whose fitted attributes depend on its parameters)."""
        return self._FITTED

    def _check_fitted(self, state: dict) -> None:
        """What `_FITTED` cannot say: the fitted values against each other (an `InvalidModelError`)."""

    def __setstate__(self, state):
        super().__setstate__(self._checked_state(state))  # it may be somebody else's file

    def _checked_state(self, state: dict) -> dict:
        """``state`` with its fitted numbers as Python's, or an `InvalidModelError`: keys other than the parameters
        and fitted attributes, some fitted attributes only, or values that `_FITTED` and `_check_fitted` refuse."""
        name, params, fitted = type(self).__name__, self._get_param_names(), self._fitted_spec(state)
        unknown = sorted(str(key)[:40] for key in state if key not in (*params, *fitted, *OPTIONAL))[:5]
        if unknown:
            raise InvalidModelError(f"the saved {name} has unknown attributes: {', '.join(unknown)}")
        if missing := [key for key in params if key not in state]:
            raise InvalidModelError(f"the saved {name} lacks its parameters {', '.join(missing)}")
        if not (present := [key for key in fitted if key in state]):
            return state  # not fitted
        if len(present) != len(fitted):
            lacks = ", ".join(sorted(set(fitted) - set(present)))
            raise InvalidModelError(f"the saved {name} has some fitted attributes only: lacks {lacks}")
        state, sizes = dict(state), {}
        for key, spec in fitted.items():
            state[key] = _checked(key, state[key], spec, {**sizes, **state})
            if not isinstance(spec[0], type):  # an array: it sets the sizes it has first
                sizes.update((size, n) for size, n in zip(spec, state[key].shape, strict=True) if size not in sizes)
        check_feature_names(state)
        self._check_fitted(state)
        return state


def _checked(key: str, value, spec: tuple, known: dict):
    """``value`` (a number as Python's), or an `InvalidModelError` saying what ``spec`` of `_FITTED` wants."""
    if not isinstance(spec[0], type):
        if not (isinstance(value, np.ndarray) and value.ndim == len(spec) and value.size):
            raise InvalidModelError(f"{key} must be a {len(spec)}-D array")
        shape = tuple(size if isinstance(size, int) else known.get(size, n) for size, n in zip(spec, value.shape))
        if value.dtype != np.float64:
            raise InvalidModelError(f"{key} must be a {len(spec)}-D float64 array")
        if value.shape != shape:
            raise InvalidModelError(f"{key} must be a float64 array of shape {shape}")
        if not np.isfinite(value).all():
            raise InvalidModelError(f"the fitted arrays must be finite: {key} is not")
        return value
    kind, low, high = (known.get(bound, bound) for bound in spec)
    if kind is Integral:
        typed = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        words = "a positive int" if high is None else f"an int from {low} to {high}"
    else:
        typed = isinstance(value, (float, np.floating))
        words = f"a {'finite ' if high < np.inf else ''}float from {low} to {high}"
    if not (typed and low <= value <= (np.inf if high is None else high)):
        raise InvalidModelError(f"{key} must be {low if low == high else words}, got {value!r}")
    return int(value) if kind is Integral else float(value)
