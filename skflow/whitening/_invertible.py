"""``Whitener.inverse_transform`` exists only for a fitted map that keeps every direction."""

import functools
import types

__all__ = ["NotInvertibleError", "WhenInvertible"]


class NotInvertibleError(ValueError, AttributeError):
    """A fitted `Whitener` that removes or leaves out directions has no ``inverse_transform``.

    An AttributeError too (as scikit-learn's ``NotFittedError``): ``hasattr`` says the method is missing.
    """


class WhenInvertible:
    """``Whitener.inverse_transform``: there only when the fitted map keeps every direction."""

    def __init__(self, method):
        self.method = method
        functools.update_wrapper(self, method)

    def __get__(self, whitener, owner=None):
        if whitener is None:
            return self.method
        n_kept, n_features = getattr(whitener, "n_components_", None), getattr(whitener, "n_features_in_", None)
        if n_kept is not None and n_kept < n_features:
            raise NotInvertibleError(
                f"Whitener.inverse_transform needs a map that keeps all {n_features} directions, but this one "
                f"keeps {n_kept}: directions removed by n_remove or left out by n_components are lost and "
                "cannot be recovered. Fit with n_remove=0 and n_components=None."
            )
        return types.MethodType(self.method, whitener)
