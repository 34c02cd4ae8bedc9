"""Synthetic embedding-like data with known difficulties, for tests and benchmarks."""

import numpy as np
from sklearn.utils import check_random_state

__all__ = ["make_anisotropic_mixture"]


def make_anisotropic_mixture(
    n_samples: int = 1000,
    n_features: int = 64,
    *,
    n_components: int = 4,
    df: float = 3.0,
    condition_number: float = 1e4,
    random_state=None,
) -> np.ndarray:
    """Heavy-tailed mixture seen through a badly conditioned random linear map.

    Draws from ``n_components`` Student-t clusters (``df`` degrees of freedom,
    random centres), then applies a random rotation with singular values
    spread geometrically so that the covariance has roughly the given
    ``condition_number``: anisotropic and non-Gaussian, like raw sentence
    embeddings.

    Parameters
    ----------
    n_samples : int, default=1000
        Rows to draw.
    n_features : int, default=64
        Columns of each row.
    n_components : int, default=4
        Clusters of the mixture.
    df : float, default=3.0
        Degrees of freedom of the Student-t clusters: smaller is heavier-tailed.
    condition_number : float, default=1e4
        About the condition number of the covariance.
    random_state : int, RandomState instance or None, default=None
        Seeds the draw: the same seed gives the same array.

    Returns
    -------
    X : ndarray of shape (n_samples, n_features), float64

    Examples
    --------
    >>> import numpy as np
    >>> from skflow.synthetic import make_anisotropic_mixture
    >>> X = make_anisotropic_mixture(2000, 16, random_state=0)
    >>> X.shape
    (2000, 16)
    >>> bool(np.linalg.cond(np.cov(X.T)) > 1e3)
    True
    """
    rng = check_random_state(random_state)
    centres = rng.normal(scale=2.0, size=(n_components, n_features))
    labels = rng.randint(n_components, size=n_samples)
    latent = centres[labels] + rng.standard_t(df, size=(n_samples, n_features))
    rotation, _ = np.linalg.qr(rng.normal(size=(n_features, n_features)))
    # Singular values spread over sqrt(condition_number) give that covariance condition.
    singular = np.geomspace(1.0, 1.0 / np.sqrt(condition_number), n_features)
    return latent @ (rotation * singular) @ np.linalg.qr(rng.normal(size=(n_features, n_features)))[0]
