"""A fitted flow's saved state, checked before anything is built from it.

A saved FlowGaussianizer holds its flow as a configuration and a dict of
numpy arrays. The state may come from a file somebody else wrote, so it is
checked first: the configuration's keys, types and ranges; the flow it
describes is built on PyTorch's ``meta`` device (shapes only, no memory) and
its parameters must match the saved arrays exactly in names, shapes and
kinds; the standardisation and optimiser state must fit the same sizes. Only
then is the real flow built, and it is no larger than the arrays in the file.
"""

from numbers import Integral

import numpy as np
import torch

from skflow.flows import COUPLINGS, PERMUTATIONS, Glow

_CONFIG_INTS = ("n_features", "n_levels", "depth", "hidden_channels")


class InvalidModelError(ValueError):
    """A saved model whose state is inconsistent or not what skflow writes."""


def restore_flow(state: dict) -> Glow:
    """The float64 CPU flow of a FlowGaussianizer's saved ``state`` (its ``__getstate__``), checked."""
    config, weights = state.get("_flow_config"), state.get("flow_")
    if "mean_" not in state:
        raise InvalidModelError("this model was saved by an older skflow (before the standardisation); fit it again")
    _check_config(config)
    if not isinstance(weights, dict) or not all(isinstance(a, np.ndarray) for a in weights.values()):
        raise InvalidModelError("the flow's weights must be a dict of numpy arrays")
    n_saved = sum(a.size for a in weights.values())
    too_large = [key for key in _CONFIG_INTS if config[key] > n_saved]
    if too_large:
        raise InvalidModelError(f"the flow's {', '.join(too_large)} exceed the {n_saved} saved weights")
    try:
        with torch.device("meta"):  # shapes only: nothing is allocated
            template = Glow(**config).double().state_dict()
    except (RuntimeError, ValueError) as exc:
        raise InvalidModelError(f"the flow's configuration describes no valid flow: {exc}") from None
    if set(template) != set(weights):
        missing, extra = sorted(set(template) - set(weights)), sorted(set(weights) - set(template))
        raise InvalidModelError(f"the weights do not fit the configuration (missing {missing[:3]}, extra {extra[:3]})")
    for name, expected in template.items():
        array = weights[name]
        kind = "f" if expected.is_floating_point() else "i"
        if tuple(array.shape) != tuple(expected.shape) or array.dtype.kind != kind:
            raise InvalidModelError(
                f"weight {name!r} is {array.dtype}{list(array.shape)}, the configuration needs {list(expected.shape)}"
            )
        if kind == "f" and not np.isfinite(array).all():
            raise InvalidModelError(f"weight {name!r} is not finite")
    _check_fitted_arrays(state, config["n_features"], sum(t.numel() for t in template.values()))
    flow = Glow(**config).double()
    flow.load_state_dict({name: torch.tensor(np.array(a)) for name, a in weights.items()})
    return flow.eval().requires_grad_(False)


def _check_config(config) -> None:
    expected = {*_CONFIG_INTS, "coupling", "permutation"}
    if not isinstance(config, dict) or set(config) != expected:
        raise InvalidModelError(f"the flow's configuration must have the keys {sorted(expected)}")
    for key in _CONFIG_INTS:
        value = config[key]
        if not isinstance(value, Integral) or isinstance(value, bool) or value < 1:
            raise InvalidModelError(f"the flow's {key} must be a positive int, got {value!r}")
    if config["coupling"] not in COUPLINGS or config["permutation"] not in PERMUTATIONS:
        raise InvalidModelError(f"unknown coupling or permutation: {config['coupling']!r}, {config['permutation']!r}")


def _check_fitted_arrays(state: dict, n_modelled: int, n_parameters_and_buffers: int) -> None:
    n_features = state.get("n_features_in_")
    if not isinstance(n_features, Integral) or isinstance(n_features, bool) or n_features < n_modelled:
        raise InvalidModelError(f"n_features_in_ must be an int of at least {n_modelled}, got {n_features!r}")
    arrays = {name: state.get(name) for name in ("mean_", "scale_", "constant_features_")}
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray) or array.shape != (n_features,):
            raise InvalidModelError(f"{name} must be an array of shape ({n_features},)")
    constant = arrays["constant_features_"]
    if constant.dtype != bool or int((~constant).sum()) != n_modelled:
        raise InvalidModelError(f"constant_features_ must be a bool mask leaving {n_modelled} features to the flow")
    scale, mean = arrays["scale_"], arrays["mean_"]
    if not (np.isfinite(mean).all() and np.isfinite(scale).all() and (scale > 0).all()):
        raise InvalidModelError("mean_ and scale_ must be finite and scale_ positive")
    trainer = state.get("_trainer_state")
    if trainer is not None:
        moments = [trainer.get(k) if isinstance(trainer, dict) else None for k in ("exp_avg", "exp_avg_sq")]
        if any(not isinstance(m, np.ndarray) or m.ndim != 1 or m.size > n_parameters_and_buffers for m in moments):
            raise InvalidModelError("the optimiser state does not fit the flow")
