"""The scikit-learn surface of a fitted flow: what `FlowGaussianizer` does once fitted.

Like scikit-learn's ``_BasePCA``: the estimator fits ``flow_`` (a float64
CPU :class:`~skflow.flows.Glow` in eval mode), its ``_flow_config``,
``n_features_in_`` and the standardisation before the flow (``mean_``,
``scale_``, ``constant_features_``; see `skflow.flow_estimator._scaling`);
this base maps data to the latent space and back, scores, samples, exports
to ONNX, and pickles the flow as numpy arrays (checked when read back). How
the flow is trained is the estimator's own business.
"""

from numbers import Integral
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from skflow.base import EmbeddingMapMixin
from skflow.flow_estimator._arrays import (
    inverse,
    latent_and_log_prob,
    validate_latents,
)
from skflow.flow_estimator._scaling import FeatureScaling
from skflow.flow_estimator._state import restore_flow


class BaseFlow(ClassNamePrefixFeaturesOutMixin, EmbeddingMapMixin, BaseEstimator):
    """Transform, inverse-transform, score and sample with a fitted ``flow_``."""

    def inverse_transform(self, X):
        """Map latent vectors back to the data space (exact inverse of `transform`).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)
            Latent vectors.

        Returns
        -------
        X_original : ndarray of the same shape as ``X``
        """
        check_is_fitted(self)
        Z = validate_latents(X, self.n_features_in_)
        X_original = inverse(self.flow_, self._scaling(), Z.reshape(-1, Z.shape[-1]))
        return X_original.reshape(Z.shape).astype(Z.dtype, copy=False)

    def sample(self, n_samples=1, random_state=None):
        """Draw samples from the fitted density.

        Parameters
        ----------
        n_samples : int, default=1
        random_state : int, RandomState instance or None, default=None

        Returns
        -------
        X : ndarray of shape (n_samples, n_features)
        """
        check_is_fitted(self)
        if not isinstance(n_samples, Integral) or n_samples < 1:
            raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
        rng = check_random_state(random_state)
        Z = rng.standard_normal((n_samples, self.n_features_in_))
        Z[:, self.constant_features_] = 0.0  # constant features: their value
        return self.inverse_transform(Z)

    def to_onnx(self, path) -> Path:
        """Write the fitted forward map ``x -> z`` (``transform``) as an ONNX model.

        The graph takes ``x`` of shape ``(batch, n_features_in_)`` in float32,
        for any batch size, and returns ``z`` of the same shape: centring, the
        standardisation, the flow (LU matrices formed once in float64), and
        constant features passed through centred. It computes in float32,
        where ``transform`` computes in float64; on real embeddings the two
        agree to about 1e-6 of the vectors' largest value (see
        ``docs/serving.md``). Needs the ``serve`` extra (onnx, onnxscript);
        run it with onnxruntime.

        Parameters
        ----------
        path : str or path-like
            The ``.onnx`` file to write; ``~`` is expanded.

        Returns
        -------
        path : pathlib.Path

        Examples
        --------
        >>> import tempfile, numpy as np, onnxruntime
        >>> from skflow import FlowGaussianizer
        >>> from skflow.synthetic import make_anisotropic_mixture
        >>> X = make_anisotropic_mixture(1000, 8, random_state=0).astype(np.float32)
        >>> flow = FlowGaussianizer(random_state=0).fit(X)
        >>> path = flow.to_onnx(tempfile.mkdtemp() + "/flow.onnx")
        >>> session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        >>> z = session.run(None, {"x": X})[0]
        >>> bool(np.abs(z - flow.transform(X)).max() < 1e-4)
        True
        """
        check_is_fitted(self)
        from skflow.flow_estimator._onnx import export_onnx

        return export_onnx(self.flow_, self._flow_config, self._scaling(), path)

    # -------------------------------------------------------------- helpers
    def _transform_rows(self, X2d: np.ndarray) -> np.ndarray:
        return latent_and_log_prob(self.flow_, self._scaling(), X2d)[0]

    def _log_prob_rows(self, X2d: np.ndarray) -> np.ndarray:
        return latent_and_log_prob(self.flow_, self._scaling(), X2d)[1]

    def _scaling(self) -> FeatureScaling:
        return FeatureScaling(mean=self.mean_, scale=self.scale_, constant=self.constant_features_)

    @property
    def _n_features_out(self):
        return self.n_features_in_

    def __getstate__(self):
        state = dict(super().__getstate__())
        flow = state.pop("flow_", None)
        if flow is not None:
            state["flow_"] = {name: t.numpy() for name, t in flow.state_dict().items()}
        return state

    def __setstate__(self, state):
        # checked before anything is built: the state may come from somebody else's file (see skflow.load)
        flow = restore_flow(state)
        super().__setstate__({key: value for key, value in state.items() if key != "flow_"})
        if flow is not None:
            self.flow_ = flow
