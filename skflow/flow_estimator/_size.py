"""How large the Glow of a configuration is, by arithmetic alone: checked before any module is built.

A configuration may come from a user (``FlowGaussianizer(depth=10**6)``) or
from somebody else's file; building its flow, even on PyTorch's ``meta``
device, costs Python objects per step. :func:`flow_size` counts the flow's
steps and the numbers of its ``state_dict`` (parameters and buffers) with a
closed formula over its levels, and :func:`check_flow_size` refuses what
passes the bounds before anything is built (:func:`trainable_config` for
``fit``, with this machine's memory). The shapes themselves are never
restated here: a restored state is compared with the ``state_dict`` of one
step per level built on the ``meta`` device (`skflow.flow_estimator._state`).
"""

from skflow.flows import level_sizes
from skflow.utils import physical_memory

MAX_STEPS = 1_000  # depth x levels; the official flow has 9; a step is tens of kB of Python objects, even on meta
TRAINING_BYTES_PER_NUMBER = 40  # float32 weights, gradient, two moments, step scales, snapshot; float64 copy
ARCHITECTURE = ("n_levels", "depth", "hidden_channels", "coupling", "permutation")  # the estimator's parameters


def flow_size(config: dict) -> tuple[int, int]:
    """Steps (depth x levels) and numbers in the ``state_dict`` of the flow of ``config`` (positive ints)."""
    n_features, n_levels, depth, hidden = (int(config[key]) for key in ("n_features", "n_levels", "depth",
                                                                      "hidden_channels"))  # numpy ints overflow
    affine, lu = config["coupling"] == "affine", config["permutation"] == "lu"
    sizes, per_depth = level_sizes(n_features, n_levels), 0
    for size in sizes:
        per_depth += 2 * size  # ActNorm: bias, logs
        if size >= 2:
            split = size // 2
            n_out = (size - split) * (2 if affine else 1)
            per_depth += hidden * (split + hidden + n_out + 4) + 2 * n_out  # three ScaledLinears: weight, bias, logs
            per_depth += 3 * size * (size + 1) if lu else 2 * size if config["permutation"] == "random" else 0
    return depth * len(sizes), depth * per_depth


def check_flow_size(config: dict, n_saved: int | None = None) -> None:
    """Refuse, with a ValueError, a flow of more than `MAX_STEPS` steps or more weights than it may have.

    A flow read from a file may have at most ``n_saved`` weights (the numbers saved); one to train, at most
    what this machine's memory holds at `TRAINING_BYTES_PER_NUMBER` bytes a weight.
    """
    n_steps, n_numbers = flow_size(config)
    if n_steps > MAX_STEPS:
        raise ValueError(f"the flow would have {n_steps} steps (depth x levels), more than {MAX_STEPS}")
    if n_saved is not None:
        if n_numbers > n_saved:
            raise ValueError(f"the flow would have {n_numbers} weights, more than the {n_saved} saved")
    elif (memory := physical_memory()) is not None and n_numbers * TRAINING_BYTES_PER_NUMBER > memory:
        raise ValueError(
            f"the flow would have {n_numbers} weights; training them takes about {TRAINING_BYTES_PER_NUMBER} bytes "
            f"each, more than this machine's {memory / 2**30:.1f} GiB of memory"
        )


def trainable_config(params: dict, n_features: int) -> dict:
    """The flow configuration of a FlowGaussianizer's ``params`` for ``n_features``, if this machine can train it.

    Else a ValueError, by arithmetic: nothing is built.
    """
    config = {"n_features": n_features, **{key: params[key] for key in ARCHITECTURE}}
    try:
        check_flow_size(config)
    except ValueError as exc:
        raise ValueError(f"FlowGaussianizer: {exc}; lower depth, n_levels or hidden_channels") from None
    return config
