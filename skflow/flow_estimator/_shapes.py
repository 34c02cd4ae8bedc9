"""The arrays of a Glow's ``state_dict``, computed from its configuration by arithmetic alone.

A saved flow is checked against these before anything is built, so a
configuration from somebody else's file costs nothing to check however large
it claims to be: :func:`n_state_arrays` and :func:`n_parameters` are closed
formulas over at most ~60 levels, and :func:`state_arrays` is only called once
the count matches the file's. ``tests/test_untrusted_files.py`` compares them
with the ``state_dict`` of real flows of every configuration.
"""

from typing import NamedTuple

import numpy as np

from skflow.flows import level_sizes


class ArraySpec(NamedTuple):
    shape: tuple[int, ...]
    dtype: np.dtype
    parameter: bool  # trained (in the optimiser's flat vector), else a buffer


_F64, _I64 = np.dtype(np.float64), np.dtype(np.int64)
# Arrays per step, by permutation, when the step has at least two features (else ActNorm alone).
_PERMUTATION_ARRAYS = {"reverse": 0, "random": 2, "lu": 6}
_ACTNORM_ARRAYS, _COUPLING_ARRAYS = 2, 9


def n_state_arrays(config: dict) -> int:
    """How many arrays the flow of ``config`` (checked by ``check_config``) has."""
    per_step = [
        _ACTNORM_ARRAYS + (_PERMUTATION_ARRAYS[config["permutation"]] + _COUPLING_ARRAYS if size >= 2 else 0)
        for size in _sizes(config)
    ]
    return config["depth"] * sum(per_step)


def n_parameters(config: dict) -> int:
    """How many trained numbers the flow of ``config`` has: the length of the optimiser's moment vectors."""
    hidden, total = config["hidden_channels"], 0
    for size in _sizes(config):
        step = 2 * size  # ActNorm: bias, logs
        if size >= 2:
            split = size // 2
            n_out = (size - split) * (2 if config["coupling"] == "affine" else 1)
            step += (split + 2) * hidden + (hidden + 2) * hidden + (hidden + 2) * n_out
            if config["permutation"] == "lu":
                step += 2 * size * size + size
        total += step
    return config["depth"] * total


def state_arrays(config: dict) -> dict[str, ArraySpec]:
    """Name -> shape, dtype and kind of every array of the float64 flow of ``config``, in ``state_dict`` order."""
    hidden, out = config["hidden_channels"], {}
    for level, size in enumerate(_sizes(config)):
        for step in range(config["depth"]):
            prefix = f"levels.{level}.{step}."
            out[prefix + "actnorm.bias"] = out[prefix + "actnorm.logs"] = ArraySpec((size,), _F64, True)
            if size < 2:
                continue
            out.update({prefix + "permutation." + name: spec for name, spec in _permutation(config, size).items()})
            split = size // 2
            n_out = (size - split) * (2 if config["coupling"] == "affine" else 1)
            for layer, (n_in, n_units) in zip(("hidden1", "hidden2", "out"), ((split, hidden), (hidden, hidden),
                                                                             (hidden, n_out))):
                name = f"{prefix}coupling.net.{layer}."
                out[name + "weight"] = ArraySpec((n_units, n_in), _F64, True)
                out[name + "bias"] = out[name + "logs"] = ArraySpec((n_units,), _F64, True)
    return out


def _permutation(config: dict, size: int) -> dict[str, ArraySpec]:
    if config["permutation"] == "random":
        return {"perm": ArraySpec((size,), _I64, False), "inv_perm": ArraySpec((size,), _I64, False)}
    if config["permutation"] == "lu":
        return {
            "lower": ArraySpec((size, size), _F64, True),
            "upper": ArraySpec((size, size), _F64, True),
            "log_s": ArraySpec((size,), _F64, True),
            "perm": ArraySpec((size,), _I64, False),
            "sign_s": ArraySpec((size,), _F64, False),
            "lower_mask": ArraySpec((size, size), _F64, False),
        }
    return {}


def _sizes(config: dict) -> list[int]:
    return level_sizes(config["n_features"], config["n_levels"])
