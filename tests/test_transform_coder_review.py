"""TransformCoder under hostile input: the review's findings, each a failing case before its fix."""

import tracemalloc

import numpy as np
import pytest
from sklearn.utils._param_validation import InvalidParameterError

from skflow import TransformCoder
from skflow.compression import search
from skflow.persistence import InvalidModelError

FLOAT32_MAX = float(np.finfo(np.float32).max)


def test_a_bool_n_bytes_is_refused_by_the_parameter_check():
    X = np.random.RandomState(0).normal(size=(50, 16))
    with pytest.raises(InvalidParameterError, match="n_bytes.*Got True instead"):
        TransformCoder(n_bytes=True).fit(X)


@pytest.mark.parametrize("n_bytes", [np.int8(127), np.uint8(255)], ids=repr)
def test_a_small_numpy_integer_n_bytes_does_not_wrap_around(n_bytes):
    """n_bytes + 1 in int8 or uint8 wrapped to -128 or 0 in the allocation: a negative dimension, an IndexError."""
    X = np.random.RandomState(0).normal(size=(40, 2 * int(n_bytes)))
    coder = TransformCoder(n_bytes=n_bytes, random_state=0).fit(X)
    assert coder.n_bytes_ == int(n_bytes) and coder.transform(X[:3]).shape == (3, int(n_bytes))


def test_directions_of_rounding_noise_get_no_bytes():
    """5 rows span 4 directions: the other 12 have variances of rounding (1e-16), no variance, and their bytes are
    0 at the end, as the class docstring says; they had 4 bits each."""
    X = np.random.RandomState(0).normal(size=(5, 16))
    coder = TransformCoder(n_bytes=8, random_state=0).fit(X)
    assert coder.n_bits_.tolist() == [4] * 8
    codes = coder.transform(X)
    assert codes.shape == (5, 8) and not codes[:, 4:].any()


def test_a_saved_state_of_more_bytes_than_4_bits_a_feature_is_refused():
    """n_bytes = n_bytes_ = 10**12 loaded, then its transform asked for 182 TiB."""
    X = np.random.RandomState(0).normal(size=(100, 16))
    state = TransformCoder(n_bytes=4, random_state=0).fit(X).__getstate__()
    for n_bytes in (9, 10**12):
        with pytest.raises(InvalidModelError, match=r"n_bytes_ must be at most 8"):
            TransformCoder().__setstate__({**state, "n_bytes": n_bytes, "n_bytes_": n_bytes})


def test_decoded_vectors_stay_finite_near_float32s_largest_value():
    """Rows of +-3.4e38 (float32, accepted by fit): the levels s g (g up to 2.73) passed float32's range, so
    inverse_transform gave inf, score() 0.0, and search blamed 'a correction factor' of a Quantizer."""
    X = (np.sign(np.random.RandomState(0).normal(size=(300, 16))) * 3.4e38).astype(np.float32)
    coder = TransformCoder(n_bytes=8, random_state=0).fit(X)
    codes = coder.transform(X)
    decoded = coder.inverse_transform(codes)
    assert np.isfinite(decoded).all()
    assert coder.score(X) > 0.9
    _, found = search(X[:5].astype(np.float64), codes, 1, codes=coder)
    assert found[:, 0].tolist() == [0, 1, 2, 3, 4]
    state = coder.__getstate__()  # a saved scale at float32's largest value: still finite vectors
    crafted = TransformCoder()
    crafted.__setstate__({**state, "scale_": np.full_like(state["scale_"], FLOAT32_MAX)})
    assert np.isfinite(crafted.inverse_transform(codes)).all()


def test_three_d_codes_of_no_rows_are_refused_in_one_line():
    X = np.random.RandomState(0).normal(size=(50, 16))
    coder = TransformCoder(n_bytes=4, random_state=0).fit(X)
    with pytest.raises(ValueError, match=r"X has shape \(5, 0, 4\): no codes to decode"):
        coder.inverse_transform(np.zeros((5, 0, 4), np.uint8))


def test_inverse_transform_holds_no_more_than_a_block_beyond_its_output():
    """The whole corpus's values (n, n_components_) and their temporaries were held at once: 3.5 times the output."""
    rng = np.random.RandomState(0)
    coder = TransformCoder(n_bytes=32, random_state=0).fit(rng.normal(size=(500, 64)))
    codes = rng.randint(0, 256, size=(60_000, 32)).astype(np.uint8)
    output = codes.shape[0] * 64 * 4
    tracemalloc.start()
    try:
        coder.inverse_transform(codes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * output
