"""A restored model checked before it is used: every estimator inside it, however nested.

skops restores a ``Pipeline``, ``FeatureUnion`` or ``ColumnTransformer`` as
data: a crafted file can give one steps that are not ``(name, estimator)``
pairs, or hide a ``BertEmbedder`` with invalid parameters three levels down.
The walk visits every estimator reachable from the model through its
attributes (parameters and fitted attributes alike: ``steps``,
``transformer_list``, ``transformers`` and the fitted ``transformers_``,
``best_estimator_``, ...), through lists, tuples, dicts and object arrays;
each gets its structure checked if it is one of the composites above, and
its parameters validated (``_validate_params``, as ``fit`` would, looked up
on the class) if it is skflow's or scikit-learn's. No estimator may hold an
instance attribute named like an attribute or method of its class: restored
state would replace ``transform`` or ``_validate_params`` itself.
"""

from collections.abc import Iterator

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.compose import ColumnTransformer
from sklearn.pipeline import FeatureUnion, Pipeline

from skflow.utils import InvalidModelError

_PLACEHOLDERS = ("drop", "passthrough")
_PAIRS, _TRIPLES = "(name, estimator) pairs", "(name, transformer, columns)"


def check_estimator(estimator: BaseEstimator, validated: tuple[type, ...]) -> None:
    """Refuse, with an `InvalidModelError`, a malformed composite or invalid parameters (one of `estimators`).

    ``validated``: classes whose parameters are validated besides scikit-learn's.
    """
    name = type(estimator).__name__
    _check_no_shadowing(estimator, name)
    _check_composite(estimator, name)
    ours = isinstance(estimator, validated) or type(estimator).__module__.startswith("sklearn.")
    if ours and hasattr(type(estimator), "_parameter_constraints"):  # FeatureUnion, for one, has none
        try:
            type(estimator)._validate_params(estimator)
        except (ValueError, TypeError) as exc:
            raise InvalidModelError(f"the saved {name} is invalid: {exc}") from None


def _check_no_shadowing(estimator, name: str) -> None:
    """Refuse saved state that would replace a method or class attribute (``transform``, ``_validate_params``)."""
    shadowing = sorted(key for key in vars(estimator) if hasattr(type(estimator), key))
    if shadowing:
        raise InvalidModelError(
            f"the saved {name} has attributes named like its class's methods or attributes, which they would "
            f"replace: {', '.join(shadowing)}"
        )


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


def _check_composite(estimator, name: str) -> None:
    if isinstance(estimator, Pipeline):
        _check_items(estimator.steps, f"{name}.steps", _PAIRS, allow_none=True)
    if isinstance(estimator, FeatureUnion):
        _check_items(estimator.transformer_list, f"{name}.transformer_list", _PAIRS)
    if isinstance(estimator, ColumnTransformer):
        for attribute in ("transformers", "transformers_"):
            if attribute in vars(estimator):
                _check_items(getattr(estimator, attribute), f"{name}.{attribute}", _TRIPLES)
        remainder = estimator.remainder
        if not (_is_placeholder(remainder) or isinstance(remainder, BaseEstimator)):
            raise InvalidModelError(f"{name}.remainder must be an estimator, 'drop' or 'passthrough'")


def _check_items(items, where: str, form: str, allow_none: bool = False) -> None:
    """A list of ``form`` tuples (of pairs: not empty), each holding an estimator second, their names unique."""
    width, pairs = form.count(",") + 1, form == _PAIRS
    if not isinstance(items, list) or (pairs and not items):
        raise InvalidModelError(f"{where} must be a {'non-empty ' * pairs}list of {form}, got {_kind(items)}")
    for item in items:
        if not (isinstance(item, tuple) and len(item) == width and isinstance(item[0], str)):
            raise InvalidModelError(f"{where} must be a list of {form}, got an item {_kind(item)}")
        if not (isinstance(item[1], BaseEstimator) or _is_placeholder(item[1]) or (allow_none and item[1] is None)):
            raise InvalidModelError(f"{where} holds {_kind(item[1])}, not an estimator, 'drop' or 'passthrough'")
    names = [item[0] for item in items]
    if len(set(names)) != len(names):
        raise InvalidModelError(f"{where} has repeated names: {names}")


def _is_placeholder(value) -> bool:
    return isinstance(value, str) and value in _PLACEHOLDERS


def _kind(value) -> str:
    return f"a {type(value).__name__}" if not isinstance(value, str) else repr(value)[:40]
