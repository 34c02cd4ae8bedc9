"""ITQRotation: a rotation fitted on the corpus so that one bit per dimension loses the least (ITQ)."""

from numbers import Integral, Real

import numpy as np
from sklearn.utils import check_random_state

from skflow.base import Integers
from skflow.utils import InvalidModelError, row_chunks
from skflow.whitening import MAGNITUDE_LIMIT, LinearPostProcessor, Whitener

__all__ = ["ITQRotation"]


class ITQRotation(LinearPostProcessor):
    """Centre, project on the top principal directions, and rotate so that sign bits lose the least (ITQ).

    Iterative Quantization (Gong & Lazebnik, CVPR 2011) on the centred
    corpus: with ``V`` the centred rows projected on their ``K`` principal
    directions (``K = n_components``; None keeps all ``n_features``), it
    fits the orthogonal ``K x K`` rotation ``R`` that minimises the
    quantization loss ``||sign(V R) - V R||_F^2``: from a seeded random
    (Haar) rotation, it alternates the codes ``B = sign(V R)`` and the
    orthogonal Procrustes solution ``R = U W^T`` of ``V^T B = U S W^T``.
    No step raises the loss. The output ``z = (x - mean_) @
    components_.T``, with ``components_ = (P R)^T`` (``P`` the principal
    directions as columns), is a rotation of the centred vectors: cosines
    between outputs are those of the centred (and, for ``K < n_features``,
    projected) vectors; only their sign bits change, which are what
    ``quantize_embeddings(z, "binary")`` (sentence-transformers) or
    `skflow.Quantizer` keep.

    ``n_iter`` bounds the alternations; the fit stops earlier at a fixed
    point, when a pass gives the same ``V^T B`` as the one before (then
    ``R`` cannot change). There is no tolerance: the loss keeps falling, by
    little, for hundreds of steps, and the paper's 50 steps take nearly all
    of the gain (``docs/retrieval.md``: on the 2,758 STS-B test sentences,
    K=384, the loss per row falls from 252.7 for a random rotation to 236.5
    after 50 steps and 236.4 after 200).

    The baselines are the same estimator with ``n_iter=0``:

    =====================================  ===========================================================
    parameters                             what the output is
    =====================================  ===========================================================
    ``n_iter=50`` (the default)            centred ITQ: the principal directions rotated for sign bits
    ``n_iter=0``                           the top ``K`` principal directions randomly rotated (PCA-ITQ's
                                           start, "PCA-RR")
    ``n_components=None, n_iter=0``        the centred vectors under a uniformly random (Haar) rotation
                                           of the whole space: what vector databases do, after centring
    =====================================  ===========================================================

    The last is a random rotation of the space whatever the corpus: a Haar
    rotation times the fixed basis of principal directions is Haar again.

    Everything is computed in float64, whatever the input dtype; the output
    has the input's dtype. ``fit`` reads its input a chunk of rows at a
    time: a ``numpy.memmap`` is read ``n_iter_ + 2`` times (the moments,
    one pass per step, one for the final loss), never whole; a pass costs
    ``2 n d K`` multiply-adds. There is no ``partial_fit``: each step needs every row.
    Where every direction is kept (``n_components=None``) the map is a
    rotation and has an exact ``inverse_transform``. It exports as a stock
    ``Dense`` module (`skflow.export_sentence_transformer`), so that
    ``SentenceTransformer(path).encode(texts, precision="binary")`` gives
    the codes of ``pipeline.transform(texts)`` (``docs/retrieval.md``).
    It has no ``score`` (no density): select it by STS Spearman with
    :func:`skflow.metrics.make_sts_scorer` as ``scoring=``.

    Parameters
    ----------
    n_components : int or None, default=None
        ``K``: principal directions kept, the code's bits. None keeps all
        ``n_features``.
    n_iter : int, default=50
        Most alternations of codes and rotation (the paper's 50); 0 keeps
        the random rotation (the baselines above).
    random_state : int, RandomState instance or None, default=None
        Seeds the random start rotation. Pass an int for the same map at
        every fit.

    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during :term:`fit`.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during :term:`fit`, when ``X`` has string
        column names.
    mean_ : ndarray of shape (`n_features_in_`,)
        The mean of the rows, float64, removed before the rotation.
    components_ : ndarray of shape (`n_components_`, `n_features_in_`)
        Orthonormal rows: the principal directions rotated, ``(P R)^T``.
    scale_ : ndarray of shape (`n_components_`,)
        Ones (the base's scaling: a rotation scales nothing).
    n_components_ : int
        Number of output features, ``K``.
    n_iter_ : int
        Alternations run: ``n_iter``, or fewer at a fixed point.
    quantization_loss_ : float
        The loss of the fitted rotation per row, ``||sign(V R) - V R||_F^2 /
        n_samples`` on the rows fitted on (float64), where ``sign`` is
        ``+1`` above 0 and ``-1`` elsewhere, as the binary codes have it.

    See Also
    --------
    skflow.Whitener : ``Whitener(power=0, n_components=K)`` is the same
        centring and projection without the rotation (``pca-K``).

    References
    ----------
    Gong and Lazebnik, "Iterative Quantization: A Procrustean Approach to
    Learning Binary Codes", CVPR 2011.

    Examples
    --------
    >>> import numpy as np
    >>> from skflow import ITQRotation
    >>> rng = np.random.RandomState(0)
    >>> X = rng.normal(size=(2000, 16)) @ rng.normal(size=(16, 16)) + 1
    >>> itq = ITQRotation(n_components=8, random_state=0).fit(X)
    >>> Z = itq.transform(X)
    >>> Z.shape, bool(np.allclose(itq.components_ @ itq.components_.T, np.eye(8)))
    ((2000, 8), True)
    >>> start = ITQRotation(n_components=8, n_iter=0, random_state=0).fit(X)
    >>> bool(itq.quantization_loss_ < start.quantization_loss_)
    True
    >>> rotation = ITQRotation(random_state=0).fit(X)  # every direction kept: invertible
    >>> bool(np.allclose(rotation.inverse_transform(rotation.transform(X)), X))
    True
    """

    __module__ = "skflow.compression"  # the name saved files give it, whatever module defines it

    _parameter_constraints: dict = {
        "n_components": [Integers(1, None, closed="left"), None],
        "n_iter": [Integers(0, None, closed="left")],
        "random_state": ["random_state"],
    }
    _FITTED: dict = {
        "mean_": ("d",), "n_components_": (Integral, 1, "d"), "components_": ("n_components_", "d"),
        "scale_": ("n_components_",), "n_iter_": (Integral, 0, None),
        "quantization_loss_": (Real, 0.0, np.finfo(np.float64).max), "n_features_in_": (Integral, "d", "d"),
    }
    _incremental = False  # each step needs every row: fit only
    _lost = "the directions left out by n_components are lost and cannot be recovered. Fit with n_components=None"

    def __init__(self, *, n_components=None, n_iter=50, random_state=None):
        self.n_components = n_components
        self.n_iter = n_iter
        self.random_state = random_state

    def _fit_rows(self, X2d: np.ndarray, first: bool) -> None:
        """The mean, the principal directions and the rotation, from every row of ``X2d`` (``first``: always)."""
        n_features = X2d.shape[1]
        n_kept = n_features if self.n_components is None else self.n_components
        if n_kept > n_features:
            raise ValueError(f"ITQRotation(n_components={n_kept}) needs at least {n_kept} features, but X has "
                             f"{n_features}.")
        pca = Whitener(power=0, n_components=n_kept).fit(X2d)  # centred principal directions, from the moments
        rotation, previous, n_iter = haar_rotation(n_kept, check_random_state(self.random_state)), None, 0
        while True:
            loss, cross = _quantization_pass(X2d, pca.mean_, pca.components_.T @ rotation)
            procrustes = pca.components_ @ cross.T  # V^T B, K x K
            if n_iter == self.n_iter or previous is not None and np.array_equal(procrustes, previous):
                break
            left, _, right = np.linalg.svd(procrustes)
            rotation, previous, n_iter = left @ right, procrustes, n_iter + 1
        self.mean_, self.components_ = pca.mean_, rotation.T @ pca.components_
        self.scale_, self.n_components_ = np.ones(n_kept), n_kept
        self.n_iter_, self.quantization_loss_ = n_iter, loss / X2d.shape[0]

    def _check_fitted(self, state: dict) -> None:
        """The parameters valid, ``mean_`` below `MAGNITUDE_LIMIT` (as a fit's), ``n_components_`` and ``n_iter_`` as
        they give, ``components_`` orthonormal rows and ``scale_`` ones: a rotation, nothing else."""
        rebuilt = type(self)(**{key: state[key] for key in self._get_param_names()})
        try:
            rebuilt._validate_params()
        except (ValueError, TypeError) as exc:
            raise InvalidModelError(f"the saved ITQRotation is invalid: {exc}") from None
        if state["n_components_"] != (state["n_components"] or state["n_features_in_"]):
            raise InvalidModelError("n_components_ must be n_components (n_features_in_ where it is None)")
        if not np.abs(state["mean_"]).max() < MAGNITUDE_LIMIT:  # as a fit gives: no inf out of finite rows
            raise InvalidModelError(f"mean_ must be below {MAGNITUDE_LIMIT:g} in absolute value")
        if state["n_iter_"] > state["n_iter"]:
            raise InvalidModelError(f"n_iter_ must be at most n_iter = {state['n_iter']}")
        components = state["components_"]
        if not np.allclose(components @ components.T, np.eye(len(components)), rtol=0, atol=1e-9):
            raise InvalidModelError("components_ must have orthonormal rows (a rotation): the file was edited")
        if not np.array_equal(state["scale_"], np.ones(len(components))):
            raise InvalidModelError("scale_ must be ones (a rotation scales nothing): the file was edited")


def haar_rotation(n: int, rng: np.random.RandomState) -> np.ndarray:
    """A uniformly random (Haar) ``n x n`` rotation: Q of a Gaussian matrix's QR, its columns' signs fixed."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def _quantization_pass(X2d: np.ndarray, mean: np.ndarray, weights: np.ndarray) -> tuple[float, np.ndarray]:
    """One pass over the rows, a chunk at a time: ``||B - Y||_F^2`` and ``B^T (X - mean)`` for ``Y = (X - mean) @
    weights`` and its codes ``B`` (+1 above 0, else -1: the bits ``quantize_embeddings`` keeps)."""
    loss, cross = 0.0, np.zeros((weights.shape[1], X2d.shape[1]))
    for _, part in row_chunks(X2d, np.float64):
        centred = part - mean
        rotated = centred @ weights
        codes = np.where(rotated > 0, 1.0, -1.0)
        loss += float(((codes - rotated) ** 2).sum())
        cross += codes.T @ centred
    return loss, cross
