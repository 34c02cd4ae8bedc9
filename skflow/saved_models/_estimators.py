"""Every estimator of a restored model, however nested (skops restores a composite's steps as data), checked."""

from collections.abc import Callable, Iterator

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.compose import ColumnTransformer
from sklearn.pipeline import FeatureUnion, Pipeline

from skflow.utils import InvalidModelError

# scikit-learn's own checks of a composite's steps, which its fit makes
_STEPS = {Pipeline: ("steps", Pipeline._validate_steps),
          FeatureUnion: ("transformer_list", FeatureUnion._validate_transformers),
          ColumnTransformer: ("transformers", ColumnTransformer._validate_transformers)}


def check_estimator(estimator: BaseEstimator, validated: dict[type, Callable | None]) -> None:
    """Refuse a malformed composite or invalid parameters (scikit-learn's classes', ``validated``'s and its check's)."""
    name, cls = type(estimator).__name__, type(estimator)
    shadowing = sorted(key for key in vars(estimator) if hasattr(cls, key))
    if shadowing:  # restored state would replace transform or _validate_params itself
        raise InvalidModelError(f"the saved {name} has attributes named like its class's methods or attributes, "
                                f"which they would replace: {', '.join(shadowing)}")
    checks = [(" is", cls._validate_params)] if hasattr(cls, "_parameter_constraints") and (
        issubclass(cls, tuple(validated)) or cls.__module__.startswith("sklearn.")) else []  # FeatureUnion has none
    checks += [(" is", validated[cls])] if validated.get(cls) else []
    checks += [(f"'s {attribute} are", validate) for kind, (attribute, validate) in _STEPS.items()
               if isinstance(estimator, kind)]
    for what, validate in checks:
        try:
            validate(estimator)
        except (ValueError, TypeError) as exc:
            raise InvalidModelError(f"the saved {name}{what} invalid: {exc}") from None
    fitted = vars(estimator).get("transformers_", []) if isinstance(estimator, ColumnTransformer) else []
    if not (isinstance(fitted, list) and all(_is_fitted_triple(item) for item in fitted)):
        raise InvalidModelError(f"the saved {name}'s transformers_ must be a list of (name, transformer, columns)")


def _is_fitted_triple(item) -> bool:
    return isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], str) and (
        isinstance(item[1], BaseEstimator) or item[1] in ("drop", "passthrough") and isinstance(item[1], str))


def estimators(model) -> Iterator[BaseEstimator]:
    """``model`` and every estimator reachable from it, each once."""
    seen, stack = set(), [model]
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, BaseEstimator):
            yield value
        if isinstance(value, BaseEstimator) or type(value).__module__.startswith(("sklearn.", "skflow.")) and hasattr(
                value, "__dict__"):  # an estimator's parameters and state; a search's scorer and CV splitter too
            stack.extend(reversed(list(vars(value).values())))
        elif isinstance(value, (list, tuple, dict)):
            stack.extend(reversed(list(value.values() if isinstance(value, dict) else value)))
        elif isinstance(value, np.ndarray) and value.dtype == object:
            stack.extend(reversed(value.ravel().tolist()))
