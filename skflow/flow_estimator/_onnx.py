"""The forward map of a fitted FlowGaussianizer, ``x -> z``, as an ONNX graph (float32, any batch size).

The graph is the whole map of ``transform``: centring, the standardisation of
the modelled features, the flow, and the constant features passed through
centred. It runs in float32, where ``transform`` runs in float64.
"""

import contextlib
import logging
import os
import warnings
from pathlib import Path

import torch

from skflow.flow_estimator._arrays import LatentMap
from skflow.flow_estimator._scaling import FeatureScaling
from skflow.flows import Glow, LUInvertibleLinear
from skflow.flows.base import FlowLayer
from skflow.utils import ONNX, check_output_file, install_hint, replaced_atomically


class FixedLinear(FlowLayer):
    """An LU layer's matrix, formed once in float64 from the fitted factors: fewer float32 roundings."""

    def __init__(self, layer: LUInvertibleLinear) -> None:
        super().__init__()
        self.register_buffer("weight_t", layer.weight().double().T.float().contiguous())
        self.register_buffer("log_det", layer.log_s.double().sum().float())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x @ self.weight_t, self.log_det


def export_onnx(
    fitted: Glow, config: dict, scaling: FeatureScaling, path: str | os.PathLike, opset: int = 18
) -> Path:
    """Write the map of a fitted flow (float64, built from ``config``) and its standardisation to ``path``:
    input ``x``, output ``z``, both ``(batch, n_features)``."""
    try:  # torch's exporter imports them deep inside: say which extra brings them, before any work
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"to_onnx needs onnx and onnxscript: {install_hint('serve')} ({exc})") from None
    out = check_output_file(path, kind=ONNX)  # a folder, a user's file, a missing folder: one line, before work
    flow = Glow(**config)
    flow.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in fitted.state_dict().items()})
    fitted_steps = (s for level in fitted.levels for s in level)
    for fitted_step, step in zip(fitted_steps, (s for level in flow.levels for s in level)):
        if isinstance(fitted_step.permutation, LUInvertibleLinear):
            step.permutation = FixedLinear(fitted_step.permutation)
    module = LatentMap(flow.eval(), scaling, torch.float32).eval()
    example = torch.zeros(2, len(scaling.mean), dtype=torch.float32)
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad(), _quiet_exporter():
        program = torch.onnx.export(
            module, (example,), input_names=["x"], output_names=["z"], dynamic_shapes=({0: batch},),
            opset_version=opset, dynamo=True, verbose=False,
        )
    with replaced_atomically(out, kind=ONNX) as temporary:  # the old file or the whole new one, never a part
        program.save(str(temporary))
    return out


@contextlib.contextmanager
def _quiet_exporter():
    """The exporter logs a line per torchvision operator it cannot find and warns about its own internals."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
