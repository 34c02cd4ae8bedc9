"""Saving fitted models safely: skops files that load without running code from the file.

``skflow.dump(model, path)`` writes a ``.skops`` file; ``skflow.load(path)``
reads one back, trusting exactly skflow's own estimators and the types that
skops trusts by default (scikit-learn's estimators, numpy arrays, builtins).
A file that names any other type is refused before anything in it is
built, with a message naming the type. What is restored is checked before it
is used: a FlowGaussianizer's configuration against its weights (see
`skflow._flow_state`), a BertEmbedder's parameters through its own
validation. See ``docs/serving.md`` for the threat model.
"""

import os
from pathlib import Path

from sklearn.base import BaseEstimator

from skflow._flow_state import InvalidModelError
from skflow.embedder import BertEmbedder
from skflow.gaussianizer import FlowGaussianizer

__all__ = ["SKFLOW_TYPES", "InvalidModelError", "UntrustedTypeError", "dump", "load"]

# skflow's classes that a .skops file may hold, and their names as skops gives them.
_SKFLOW_CLASSES = (BertEmbedder, FlowGaussianizer)
SKFLOW_TYPES = tuple(f"{cls.__module__}.{cls.__qualname__}" for cls in _SKFLOW_CLASSES)


class UntrustedTypeError(InvalidModelError):
    """The file holds a type that skflow does not trust; nothing in it was built."""


def dump(model: BaseEstimator, path: str | os.PathLike) -> Path:
    """Write ``model`` (a skflow or scikit-learn estimator, or a pipeline of them) to a ``.skops`` file.

    Parameters
    ----------
    model : estimator
    path : str or path-like
        The file; ``~`` is expanded. It is written under a temporary name in
        the same folder, flushed to disk and renamed: at every instant
        ``path`` holds the previous file or the whole new one.

    Returns
    -------
    path : pathlib.Path
        Where the file was written.

    Examples
    --------
    >>> import tempfile, numpy as np, skflow
    >>> from skflow.synthetic import make_anisotropic_mixture
    >>> X = make_anisotropic_mixture(500, 8, random_state=0)
    >>> flow = skflow.FlowGaussianizer(random_state=0).fit(X)
    >>> path = skflow.dump(flow, tempfile.mkdtemp() + "/flow.skops")
    >>> np.array_equal(skflow.load(path).transform(X), flow.transform(X))
    True
    """
    import skops.io

    from skflow._atomic import replaced_atomically

    path = Path(path).expanduser()
    with replaced_atomically(path) as tmp:  # the path holds the old file or the whole new one, never a part
        skops.io.dump(model, tmp)
    return path


def load(path: str | os.PathLike) -> BaseEstimator:
    """Read a ``.skops`` file written by :func:`dump` (or ``skops.io.dump``), trusting skflow's types only.

    Parameters
    ----------
    path : str or path-like
        The file; ``~`` is expanded.

    Returns
    -------
    model : estimator
        The restored estimator or pipeline; its transforms equal those of
        the saved one bit for bit.

    Raises
    ------
    UntrustedTypeError
        The file names a type other than skflow's estimators and skops's
        default trusted types; the message names it. Nothing was built.
    InvalidModelError
        A restored estimator is inconsistent (a flow whose configuration
        does not match its weights, invalid parameters, ...).
    """
    import skops.io

    path = Path(path).expanduser()
    try:
        untrusted = skops.io.get_untrusted_types(file=path)
    except Exception as exc:  # noqa: BLE001 - not a skops file: one clear error
        raise InvalidModelError(f"{path}: cannot be read as a skops file ({type(exc).__name__}: {exc})") from exc
    refused = [name for name in untrusted if name not in SKFLOW_TYPES]
    if refused:
        raise UntrustedTypeError(
            f"{path}: refusing to load a file that contains types skflow does not trust: {', '.join(refused)}. "
            "skflow.load trusts only skflow's estimators and what skops trusts by default (scikit-learn, numpy). "
            "If you trust the file's author, inspect it with skops.io.get_untrusted_types and load it with "
            "skops.io.load(path, trusted=[...])."
        )
    try:
        model = skops.io.load(path, trusted=list(untrusted))
    except InvalidModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged file: one clear error
        raise InvalidModelError(f"{path}: cannot be read as a skops file ({type(exc).__name__}: {exc})") from exc
    for estimator in _estimators(model):
        if isinstance(estimator, _SKFLOW_CLASSES):
            try:
                estimator._validate_params()
            except ValueError as exc:
                raise InvalidModelError(f"{path}: the saved {type(estimator).__name__} is invalid: {exc}") from exc
    return model


def _estimators(model):
    """``model`` and, for pipelines and other meta-estimators, the estimators inside it."""
    yield model
    for _, step in getattr(model, "steps", []):
        if step is not None and step != "passthrough":
            yield from _estimators(step)
    for _, transformer, _ in getattr(model, "transformers_", getattr(model, "transformers", [])):
        if isinstance(transformer, BaseEstimator):
            yield from _estimators(transformer)
