"""TransformCoder's correction under hostile use: the second review's findings, each a failing case before its fix."""

import copy
import pickle

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from skflow import TransformCoder
from skflow.compression import search

FLOAT32_MAX = float(np.finfo(np.float32).max)


def test_correction_set_on_after_a_plain_fit_is_refused_not_written_over_the_codes():
    """Fitted without the correction, its bits take all 8 bytes; set_params(correction=True) then wrote the factor
    over the last 4 bytes of the codes (score 0.49), and decoding the plain codes blamed a 'crafted' factor."""
    X = np.random.RandomState(0).normal(size=(500, 32)) * np.linspace(3, 0.1, 32)
    coder = TransformCoder(n_bytes=8, random_state=0).fit(X)
    codes = coder.transform(X)
    coder.set_params(correction=True)
    message = r"fitted with correction=False: its codes take 8 of n_bytes_ = 8, no room for the factor's 4"
    for use in (lambda: coder.transform(X), lambda: coder.inverse_transform(codes), lambda: coder.score(X),
                lambda: search(X[:3], codes, 3, metric="dot", codes=coder)):
        with pytest.raises(NotFittedError, match=message):
            use()
    coder.set_params(correction=False)  # back as fitted: the same codes
    assert np.array_equal(coder.transform(X), codes)


def test_a_fit_on_rows_near_float32s_largest_value_can_be_copied_and_saved():
    """The rows' spread along a direction passes float32's largest value (3.8e38 here): the fit kept it as scale_,
    and the state check then refused the coder's own state, in pickle, joblib, skflow.load and copy.deepcopy."""
    X = (np.sign(np.random.RandomState(0).normal(size=(300, 16))) * 3.4e38).astype(np.float32)
    for correction in (False, True):
        coder = TransformCoder(n_bytes=8 + 4 * correction, correction=correction, random_state=0).fit(X)
        assert coder.scale_.max() <= FLOAT32_MAX
        codes = coder.transform(X)
        for copied in (pickle.loads(pickle.dumps(coder)), copy.deepcopy(coder)):
            assert np.array_equal(copied.transform(X), codes)
        assert np.isfinite(coder.inverse_transform(codes)).all() and coder.score(X) > 0.9


def test_the_default_n_bytes_with_the_correction_names_what_it_was():
    """n_bytes=None on 16 features with the correction: the message said 'n_bytes=2', which the user never gave."""
    X = np.random.RandomState(0).normal(size=(50, 16))
    with pytest.raises(ValueError, match=r"TransformCoder\(n_bytes=None, correction=True\): ceil\(n_features / 8\) "
                                         r"= 2 bytes leaves no byte for the codes"):
        TransformCoder(correction=True).fit(X)


def test_bytes_the_allocation_leaves_are_0_before_the_factor():
    """5 rows span 4 directions: 4 bytes of codes, 4 of zeros, then the factor (the docstring had them 'at the end')."""
    X = np.random.RandomState(0).normal(size=(5, 16))
    codes = TransformCoder(n_bytes=12, correction=True, random_state=0).fit(X).transform(X)
    assert not codes[:, 4:8].any() and codes[:, :4].any() and (codes[:, -4:].copy().view("<f4") > 0).all()
