"""scikit-learn's estimator checks, in full, for the supported flow configurations."""

import pytest
from sklearn_extra_checks import EXTRA_CHECKS, assert_check_estimator_passes

from skflow import FlowGaussianizer

CONFIGS = [
    FlowGaussianizer(),
    FlowGaussianizer(coupling="affine"),
    FlowGaussianizer(permutation="lu"),
    FlowGaussianizer(coupling="affine", permutation="random", n_levels=2, depth=2),
    FlowGaussianizer(early_stopping=True, max_epochs=3, n_iter_no_change=1),
]



@pytest.mark.parametrize("estimator", CONFIGS, ids=repr)
def test_check_estimator_passes_every_check(estimator):
    assert_check_estimator_passes(estimator)


@pytest.mark.parametrize("check", EXTRA_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("estimator", CONFIGS[:3], ids=repr)
def test_checks_outside_check_estimator(estimator, check):
    # A SkipTest (e.g. a missing pandas or polars) would surface as an error here, not a skip.
    check(type(estimator).__name__, estimator)
