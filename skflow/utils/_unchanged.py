"""Fitting that fails leaves the estimator as it was."""

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def unchanged_on_failure(estimator, also=None) -> Iterator[None]:
    """Leave ``estimator``, and ``also`` (a trainer with ``snapshot()`` and ``rollback(snapshot)``), exactly as they
    were if the block raises or is interrupted (Ctrl-C too).

    Validation records ``n_features_in_`` before anything can fail, and
    ``partial_fit`` trains a kept trainer in place: both are undone.
    """
    before = estimator.__dict__.copy()
    saved = None if also is None else also.snapshot()
    try:
        yield
    except BaseException:
        estimator.__dict__.clear()
        estimator.__dict__.update(before)
        if also is not None:
            also.rollback(saved)
        raise
