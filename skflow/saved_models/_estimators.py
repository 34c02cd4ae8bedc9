"""A restored model checked before it is used: every estimator inside it, however nested.

skops restores a ``Pipeline``, ``FeatureUnion`` or ``ColumnTransformer`` as data: its steps may be anything, and
a ``BertEmbedder`` with invalid parameters may hide three levels down, in a parameter or a fitted attribute.
"""

from collections.abc import Iterator

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.compose import ColumnTransformer
from sklearn.pipeline import FeatureUnion, Pipeline

from skflow.utils import InvalidModelError

# scikit-learn's own checks of a composite's steps, which its fit makes
_STEPS = {Pipeline: ("steps", Pipeline._validate_steps),
          FeatureUnion: ("transformer_list", FeatureUnion._validate_transformers),
          ColumnTransformer: ("transformers", ColumnTransformer._validate_transformers)}


def check_estimator(estimator: BaseEstimator, validated: tuple[type, ...]) -> None:
    """Refuse a malformed composite or invalid parameters (of scikit-learn's classes and ``validated``)."""
    name = type(estimator).__name__
    shadowing = sorted(key for key in vars(estimator) if hasattr(type(estimator), key))
    if shadowing:  # restored state would replace transform or _validate_params itself
        raise InvalidModelError(
            f"the saved {name} has attributes named like its class's methods or attributes, which they would "
            f"replace: {', '.join(shadowing)}"
        )
    ours = isinstance(estimator, validated) or type(estimator).__module__.startswith("sklearn.")
    try:
        if ours and hasattr(type(estimator), "_parameter_constraints"):  # FeatureUnion, for one, has none
            type(estimator)._validate_params(estimator)
    except (ValueError, TypeError) as exc:
        raise InvalidModelError(f"the saved {name} is invalid: {exc}") from None
    for cls, (attribute, validate) in _STEPS.items():
        try:
            if isinstance(estimator, cls):
                validate(estimator)
        except (ValueError, TypeError) as exc:
            raise InvalidModelError(f"the saved {name}'s {attribute} are invalid: {exc}") from None
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
            stack.extend(reversed(list(vars(value).values())))
        elif isinstance(value, (list, tuple)):
            stack.extend(reversed(value))
        elif isinstance(value, dict):
            stack.extend(reversed(list(value.values())))
        elif isinstance(value, np.ndarray) and value.dtype == object:
            stack.extend(reversed(value.ravel().tolist()))
