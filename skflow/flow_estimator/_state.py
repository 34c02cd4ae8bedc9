"""A fitted flow's saved state, checked once, as restored, before the flow is built from it.

A saved FlowGaussianizer holds its flow as a configuration and a dict of
numpy arrays. The state may come from a file somebody else wrote, so it is
checked first: fitted attributes and weights come together or not at all;
the configuration's keys, types and ranges; its size by arithmetic against
the bounds and the saved weights (`skflow.flow_estimator._size`), before any
module is built; then every array against the ``state_dict`` of one step
per level built on the ``meta`` device (names, shapes, dtypes: derived from
the modules, not restated), the values that must hold (finite, bounded
scales, permutations), and the optimiser state that ``partial_fit``
continues from. Only then is the whole flow built on ``meta`` and given the
saved arrays (no random initialisation). ``skflow.load`` bounds the
archive's memory before skops reads it (`skflow.saved_models`) and relies on
this check for the flow.
"""

from numbers import Integral, Real

import numpy as np
import torch

from skflow.base import check_feature_names
from skflow.flow_estimator._size import check_flow_size
from skflow.flows import COUPLINGS, PERMUTATIONS, Glow
from skflow.utils import InvalidModelError

_CONFIG_INTS = ("n_features", "n_levels", "depth", "hidden_channels")
TRAINER_KEYS = ("exp_avg", "exp_avg_sq", "n_steps", "generator", "reference_loss")
# What fit and partial_fit leave besides flow_; all present, or none of them.
_FITTED = ("n_features_in_", "_flow_config", "mean_", "scale_", "constant_features_", "n_iter_", "loss_curve_",
           "n_samples_seen_", "validation_scores_", "best_validation_score_", "n_steps_", "_trainer_state")


def restore_flow(state: dict) -> Glow | None:
    """The float64 CPU flow of a FlowGaussianizer's saved ``state`` (its ``__getstate__``), checked.

    None for an unfitted estimator's state.
    """
    check_fitted_keys(state)
    if state.get("flow_") is None:
        return None
    config, weights = state["_flow_config"], state["flow_"]
    _check_config(config)
    if not isinstance(weights, dict) or not all(isinstance(a, np.ndarray) for a in weights.values()):
        raise InvalidModelError("the flow's weights must be a dict of numpy arrays")
    try:
        check_flow_size(config, n_saved=sum(a.size for a in weights.values()))
    except ValueError as exc:
        raise InvalidModelError(f"the flow's configuration is refused: {exc}") from None
    with torch.device("meta"):  # shapes only, of one step per level: the steps of a level are alike
        first_steps = Glow(**{**config, "depth": 1}).double()
    expected = {  # names "levels.<level>.<step>.<layer>..."
        f"levels.{level}.{step}.{rest}": tensor
        for key, tensor in first_steps.state_dict().items() for _, level, _, rest in [key.split(".", 3)]
        for step in range(config["depth"])
    }
    if set(expected) != set(weights):
        missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
        raise InvalidModelError(f"the weights do not fit the configuration (missing {missing[:3]}, extra {extra[:3]})")
    for name, tensor in expected.items():
        _check_array(f"weight {name!r}", weights[name], tensor.shape, tensor.dtype)
    n_features = state["n_features_in_"]
    if not isinstance(n_features, Integral) or isinstance(n_features, bool) or n_features < config["n_features"]:
        raise InvalidModelError(f"n_features_in_ must be an int of at least {config['n_features']}, got {n_features!r}")
    for key, dtype in (("mean_", torch.float64), ("scale_", torch.float64), ("constant_features_", torch.bool)):
        _check_array(key, state[key], (n_features,), dtype)
    trainer = state["_trainer_state"]
    if not isinstance(trainer, dict) or set(trainer) != set(TRAINER_KEYS):
        raise InvalidModelError(f"the optimiser state must be a dict with the keys {list(TRAINER_KEYS)}")
    n_parameters = config["depth"] * sum(p.numel() for p in first_steps.parameters())
    for key in ("exp_avg", "exp_avg_sq"):
        _check_array(f"the optimiser state's {key}", trainer[key], (n_parameters,), torch.float32)
    generator = torch.Generator().get_state()
    _check_array("the optimiser state's generator", trainer["generator"], generator.shape, generator.dtype)
    _check_values(weights)
    _check_fitted_values(state, config["n_features"])
    with torch.device("meta"):  # every array checked: the flow the file describes, its arrays as weights
        flow = Glow(**config).double()
    flow.load_state_dict({name: torch.from_numpy(np.array(array)) for name, array in weights.items()}, assign=True)
    return flow.eval().requires_grad_(False)


def _check_config(config) -> None:
    """The configuration has exactly skflow's keys, positive ints and known names."""
    expected = {*_CONFIG_INTS, "coupling", "permutation"}
    if not isinstance(config, dict) or set(config) != expected:
        raise InvalidModelError(f"the flow's configuration must have the keys {sorted(expected)}")
    for key in _CONFIG_INTS:
        value = config[key]
        if not isinstance(value, Integral) or isinstance(value, bool) or value < 1:
            raise InvalidModelError(f"the flow's {key} must be a positive int, got {value!r}")
    if config["coupling"] not in COUPLINGS or config["permutation"] not in PERMUTATIONS:
        raise InvalidModelError(f"unknown coupling or permutation: {config['coupling']!r}, {config['permutation']!r}")


def _check_array(what: str, value, shape: tuple, dtype: torch.dtype) -> None:
    """``value`` is a numpy array of exactly ``shape`` and the numpy twin of ``dtype``."""
    needed = torch.empty((), dtype=dtype).numpy().dtype
    if not isinstance(value, np.ndarray):
        raise InvalidModelError(f"{what} must be a numpy array, got {type(value).__name__}")
    if value.shape != tuple(shape) or value.dtype != needed:
        raise InvalidModelError(f"{what} is {value.dtype}{list(value.shape)}, the configuration needs "
                                f"{needed}{list(shape)}")


def check_fitted_keys(state: dict) -> None:
    """Fitted attributes and flow weights (``flow_``, not None) in ``state``: all of them, or none."""
    fitted = state.get("flow_") is not None
    present = [k for k in state if k in _FITTED or (k.endswith("_") and not k.startswith("__") and k != "flow_")]
    if not fitted and present:
        raise InvalidModelError(f"the model has fitted attributes ({', '.join(present[:4])}) but no flow weights")
    if fitted and "mean_" not in state:
        raise InvalidModelError("this model was saved by an older skflow (before the standardisation); fit it again")
    missing = [k for k in _FITTED if k not in state]
    if fitted and missing:
        raise InvalidModelError(f"the model has flow weights but not {', '.join(missing)}")


# Genuine fitted flows keep actnorm and coupling log-scales within a few units; e^30 per step already
# overflows float32 over a few steps.
MAX_LOG_SCALE = 30.0


def _check_values(weights: dict) -> None:
    for name, array in weights.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise InvalidModelError(f"weight {name!r} is not finite")
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("logs", "log_s") and np.abs(array).max(initial=0) > MAX_LOG_SCALE:
            raise InvalidModelError(f"weight {name!r} exceeds {MAX_LOG_SCALE} in absolute value (a scale of e^30)")
        if leaf == "perm" and not np.array_equal(np.sort(array), np.arange(array.size)):
            raise InvalidModelError(f"weight {name!r} is not a permutation")
        if leaf == "inv_perm" and not np.array_equal(array, np.argsort(weights[name[: -len(leaf)] + "perm"])):
            raise InvalidModelError(f"weight {name!r} is not the inverse of its permutation")
        if leaf == "sign_s" and not np.isin(array, (-1.0, 1.0)).all():
            raise InvalidModelError(f"weight {name!r} must hold signs (-1 or 1)")
        if leaf == "lower_mask" and not np.array_equal(array, np.tril(np.ones_like(array), -1)):
            raise InvalidModelError(f"weight {name!r} must be the strictly lower triangular mask")


def _check_fitted_values(state: dict, n_modelled: int) -> None:
    constant, scale, mean = state["constant_features_"], state["scale_"], state["mean_"]
    if int((~constant).sum()) != n_modelled:
        raise InvalidModelError(f"constant_features_ must be a bool mask leaving {n_modelled} features to the flow")
    if not (np.isfinite(mean).all() and np.isfinite(scale).all() and (scale > 0).all()):
        raise InvalidModelError("mean_ and scale_ must be finite and scale_ positive")
    if np.abs(mean).max(initial=0) > 1e20 or scale.min(initial=1) < 1e-35 or scale.max(initial=1) > 1e20:
        raise InvalidModelError(
            "mean_ must be at most 1e20 in absolute value and scale_ from 1e-35 to 1e20 (fit refuses values whose "
            "squares overflow float32)"
        )
    check_feature_names(state)
    for key in ("n_iter_", "n_samples_seen_", "n_steps_"):
        if not _is_count(state[key]):
            raise InvalidModelError(f"{key} must be a non-negative int, got {state[key]!r}")
    for key in ("loss_curve_", "validation_scores_"):
        values = state[key]
        if not (values is None and key == "validation_scores_") and not (
            isinstance(values, list) and all(_is_number(v) for v in values)
        ):
            raise InvalidModelError(f"{key} must be a list of numbers")
    if not (state["best_validation_score_"] is None or _is_number(state["best_validation_score_"])):
        raise InvalidModelError("best_validation_score_ must be a number or None")
    _check_trainer(state["_trainer_state"])


def _check_trainer(trainer: dict) -> None:
    """What partial_fit continues from, so that a bad one is refused here and not in the next partial_fit."""
    if not (np.isfinite(trainer["exp_avg"]).all() and np.isfinite(trainer["exp_avg_sq"]).all()):
        raise InvalidModelError("the optimiser state's moments must be finite")
    if (trainer["exp_avg_sq"] < 0).any():
        raise InvalidModelError("the optimiser state's exp_avg_sq must be non-negative")
    if not _is_count(trainer["n_steps"]):
        raise InvalidModelError(f"the optimiser state's n_steps must be a non-negative int, got {trainer['n_steps']!r}")
    reference = trainer["reference_loss"]
    if reference is not None and not (_is_number(reference) and np.isfinite(reference)):
        raise InvalidModelError(
            f"the optimiser state's reference_loss must be a finite number or None, got {reference!r}"
        )
    try:
        torch.Generator().set_state(torch.from_numpy(np.array(trainer["generator"])))
    except RuntimeError as exc:
        raise InvalidModelError(f"the optimiser state's generator is not a random generator state: {exc}") from None


def _is_count(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= 0


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)
