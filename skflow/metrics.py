"""STS evaluation: Spearman correlation of cosine similarities with gold scores."""

import numpy as np
from scipy.stats import spearmanr


def paired_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two ``(n, d)`` arrays (0 for a zero row)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def sts_spearman(pairs: np.ndarray, scores: np.ndarray) -> float:
    """Spearman correlation between ``cos(pairs[:, 0], pairs[:, 1])`` and ``scores``.

    Parameters
    ----------
    pairs : ndarray of shape (n_pairs, 2, n_features)
        Embeddings of the two sentences of each pair.
    scores : array-like of shape (n_pairs,)
        Gold similarity scores.

    Returns
    -------
    rho : float
        What the STS literature reports (x100 in tables).

    Examples
    --------
    >>> import numpy as np
    >>> pairs = np.array([[[1.0, 0.0], [1.0, 0.1]], [[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 1.0]]])
    >>> sts_spearman(pairs, [5.0, 0.0, 2.5])
    1.0
    """
    pairs = np.asarray(pairs)
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if pairs.ndim != 3 or pairs.shape[1] != 2:
        raise ValueError(f"pairs must have shape (n_pairs, 2, n_features), got {pairs.shape}")
    if scores.shape[0] != pairs.shape[0]:
        raise ValueError(f"got {pairs.shape[0]} pairs but {scores.shape[0]} scores")
    return float(spearmanr(paired_cosine(pairs[:, 0], pairs[:, 1]), scores).statistic)
