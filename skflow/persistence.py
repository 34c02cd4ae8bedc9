"""Saving fitted models safely: skops files that load without running code from the file (``docs/serving.md``)."""

import functools
import os
from pathlib import Path

from sklearn.base import BaseEstimator

from skflow.compression import ITQRotation, Quantizer, TransformCoder
from skflow.embedder import BertEmbedder
from skflow.embedding import check_hub_options
from skflow.engines import EngineIndex
from skflow.gaussianizer import FlowGaussianizer
from skflow.saved_models import check_estimator, estimators, read_skops_file
from skflow.utils import MODEL, InvalidModelError, UntrustedTypeError, replaced_atomically
from skflow.whitening import Centerer, MeanDirectionRemover, Whitener

__all__ = ["SKFLOW_TYPES", "InvalidModelError", "UntrustedTypeError", "dump", "load"]

# skflow's estimators, and a check of what scikit-learn's constraints cannot express (model_kwargs' keys, ...)
_SKFLOW_CLASSES = {BertEmbedder: check_hub_options, Centerer: None, EngineIndex: None, FlowGaussianizer: None,
                   ITQRotation: None, MeanDirectionRemover: None, Quantizer: None, TransformCoder: None,
                   Whitener: None}
SKFLOW_TYPES = tuple(f"{cls.__module__}.{cls.__qualname__}" for cls in _SKFLOW_CLASSES)


@functools.cache
def _search_types() -> frozenset[str]:
    """What a fitted GridSearchCV or RandomizedSearchCV holds beside estimators and arrays, plain data that skops
    restores without running code: scikit-learn's CV splitters, its scorers and the metric functions its named
    scorers call, skflow's STS scorer, and scipy.stats' distributions (frozen or not)."""
    from sklearn import metrics
    from sklearn import model_selection as ms

    scorers = [metrics.get_scorer(name) for name in metrics.get_scorer_names()]
    named = [cls for cls in vars(ms).values() if isinstance(cls, type) and issubclass(cls, (ms.BaseCrossValidator,
             ms.BaseShuffleSplit))] + [type(ms.check_cv([([0], [1])])), type(metrics.check_scoring(Whitener()))]
    named += [ms.RepeatedKFold, ms.RepeatedStratifiedKFold]  # splitters too, on another base class
    # RandomizedSearchCV's param_distributions: scipy's distributions, frozen (data: their parameters)
    from scipy import stats

    named += [type(value) for value in vars(stats).values() if isinstance(value, (stats.rv_continuous,
                                                                                   stats.rv_discrete))]
    named += [type(stats.uniform()), type(stats.randint(0, 2))]
    named += [*map(type, scorers), *(scorer._score_func for scorer in scorers)]
    return frozenset({f"{t.__module__}.{t.__qualname__}" for t in named} | {"skflow.metrics.STSScorer"})


def dump(model: BaseEstimator, path: str | os.PathLike, *, overwrite: bool = True) -> Path:
    """Write ``model`` (a skflow or scikit-learn estimator, or a pipeline of them) to a ``.skops`` file.

    Parameters
    ----------
    model : estimator
    path : str or path-like
        The file; ``~`` is expanded. At every instant it holds the previous file or the whole new one.
    overwrite : bool, default=True
        Replace a model file at ``path``: an estimator of skflow or scikit-learn in a skops or joblib file,
        recognised without unpickling it; never another file (a pickle of other data), a folder or a link
        (`OutputPathError` before anything is written). With False, nothing there is ever replaced.

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

    path = Path(path).expanduser()
    with replaced_atomically(path, kind=MODEL, overwrite=overwrite) as tmp:
        skops.io.dump(model, tmp)
    return path


def load(path: str | os.PathLike, *, trust_remote_code: bool = False,
         cache_dir: str | os.PathLike | None = None, token: str | bool | None = None) -> BaseEstimator:
    """Read a ``.skops`` file written by :func:`dump` (or ``skops.io.dump``), trusting skflow's types only.

    The file's declared sizes are bounded before skops reads any array from it, and what is restored is checked
    before it is returned (see ``docs/serving.md``).

    Parameters
    ----------
    path : str or path-like
        The file; ``~`` is expanded.
    trust_remote_code : bool, default=False
        Accept a `BertEmbedder` saved with ``trust_remote_code=True`` (its ``transform`` would run code from its
        model's repository). Set it only for files whose author you trust.
    cache_dir : str or path-like, default=None
        The embedding cache folder of every `BertEmbedder` in the file (None: no cache); a saved one is never used.
    token : str, bool or None, default=None
        The Hugging Face token of every `BertEmbedder` in the file (True: that of ``hf auth login``); a saved one
        is never used.

    Returns
    -------
    model : estimator
        The restored estimator or pipeline; its transforms equal the saved one's bit for bit.

    Raises
    ------
    UntrustedTypeError
        The file names a type other than skflow's estimators and skops' default trusted types (named; nothing
        was built), or a `BertEmbedder` with ``trust_remote_code=True`` that the caller did not accept.
    InvalidModelError
        The file declares more data than its size allows, or a restored estimator is inconsistent (a flow whose
        configuration does not fit its weights, invalid parameters, a malformed pipeline, ...). It names the file.

    Examples
    --------
    A crafted file is refused before skops reads it: here 32 MiB of spaces deflated to 32 kB.

    >>> import tempfile, zipfile, skflow
    >>> path = tempfile.mkdtemp() + "/crafted.skops"
    >>> with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
    ...     archive.writestr("schema.json", b" " * 2**25)
    >>> skflow.load(path)
    Traceback (most recent call last):
    ...
    skflow.persistence.InvalidModelError: ...crafted.skops: schema.json declares 33554432 bytes, more than ...
    """
    import skops.io

    if not isinstance(trust_remote_code, bool):
        raise TypeError(f"trust_remote_code must be True or False, got {trust_remote_code!r}")
    path = Path(path).expanduser()
    try:
        data = read_skops_file(path)
        untrusted = set(skops.io.get_untrusted_types(data=data))
        trusted = untrusted & set(SKFLOW_TYPES)
        if untrusted - trusted:  # a search: its types are gathered (scipy.stats imported) only then
            trusted |= untrusted & _search_types()
        if refused := sorted(untrusted - trusted):
            raise UntrustedTypeError(f"types skflow does not trust: {', '.join(refused)} (it trusts its estimators, "
                                     "scikit-learn's CV splitters and scorers, scipy.stats' distributions, and skops' "
                                     "defaults: scikit-learn, numpy). Only if you trust the file's author: "
                                     "skops.io.load(path, trusted=skops.io.get_untrusted_types(file=path))")
        model = skops.io.loads(data, trusted=sorted(trusted))
        if not isinstance(model, BaseEstimator):
            raise InvalidModelError(f"holds a {type(model).__name__}, not an estimator")
        for estimator in estimators(model):  # each checked once, however nested
            check_estimator(estimator, _SKFLOW_CLASSES)
            if isinstance(estimator, BertEmbedder):
                if estimator.trust_remote_code and not trust_remote_code:  # a bool: validated above
                    raise UntrustedTypeError(f"holds a BertEmbedder with trust_remote_code=True for "
                                             f"{estimator.model_name_or_path!r} (its transform would run that "
                                             "repository's code): load it with skflow.load(path, "
                                             "trust_remote_code=True) only if you trust the file and the repository")
                estimator.cache_dir = cache_dir  # never a path that the file's author chose
                estimator.token = token  # nor the caller's login token sent for the author's repository
    except InvalidModelError as exc:  # an UntrustedTypeError too
        raise type(exc)(f"{path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - not a skops file, or a damaged one: one clear error
        raise InvalidModelError(f"{path}: cannot be read as a skops file ({type(exc).__name__}: {exc})") from exc
    return model

