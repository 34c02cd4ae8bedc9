"""Resolution of the ``device`` parameter shared by the estimators."""

import torch


def resolve_device(device: str) -> torch.device:
    """``"auto"`` is CUDA when available, else the CPU; anything else must exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):  # meta, mps, xpu...: nowhere skflow can work
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested, but CUDA is not available on this machine")
    return resolved
