import os

# The array API check of check_estimator runs only with this set before scipy loads.
os.environ.setdefault("SCIPY_ARRAY_API", "1")
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def sts_data_home() -> Path:
    """The original STS files: ``SKFLOW_DATA``, else ``../shared/data/sts`` beside the checkout."""
    path = Path(os.environ.get("SKFLOW_DATA", Path(__file__).resolve().parents[2] / "shared" / "data" / "sts")).resolve()
    if not (path / "STSBenchmark").is_dir():
        raise RuntimeError(f"STS data not found at {path}; set SKFLOW_DATA to the folder of the STS sets")
    return path
