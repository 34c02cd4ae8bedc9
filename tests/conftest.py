import json
import os
import sys
import threading

# The array API check of check_estimator runs only with this set before scipy loads.
os.environ.setdefault("SCIPY_ARRAY_API", "1")
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--full", action="store_true",
        help="run every test, the ones marked slow or ray too (what .ci/run and the README's test command run)",
    )


_PACKAGE_DIR = str(Path(__file__).resolve().parents[1] / "skflow")
_CALLED: set[str] = set()


def _record_call(frame, event, arg):
    code = frame.f_code
    if event == "call" and code.co_name != "<module>" and code.co_filename.startswith(_PACKAGE_DIR):
        _CALLED.add(code.co_filename)


def pytest_configure(config):
    """With ``SKFLOW_TRACE_MODULES=FILE``, record which skflow files had a function called (tests/test_fast_loop.py)."""
    if os.environ.get("SKFLOW_TRACE_MODULES"):
        sys.setprofile(_record_call)
        threading.setprofile(_record_call)


def pytest_unconfigure(config):
    if path := os.environ.get("SKFLOW_TRACE_MODULES"):
        sys.setprofile(None)
        Path(path).write_text(json.dumps(sorted(_CALLED)))


# What makes a test slow on 2 cores, marked here once rather than test by test: fixtures that embed real STS data
# or fit on it (tens of seconds each), and whole files of such tests. A test that starts Ray is marked ``ray``.
SLOW_FIXTURES = {
    "stsb_test_cls", "stsb_test_mean", "stsb_test", "sentences", "texts", "embedded", "stock_folder", "exported",
    "encoder_folders", "fitted_pipeline", "flow_search", "embeddings", "rows", "cache_dir",
}
SLOW_FILES = {"test_gaussianizer_checks.py", "test_readme.py", "test_stock_export.py", "test_gaussianization.py"}
RAY_FIXTURES = {"ray_instance", "s3"}
RAY_FILES = {"test_distributed.py", "test_s3.py", "test_s3_rows.py"}


def _mark(item) -> None:
    names, file = set(getattr(item, "fixturenames", ())), item.path.name
    if names & RAY_FIXTURES or file in RAY_FILES:
        item.add_marker(pytest.mark.ray)
    if names & SLOW_FIXTURES or file in SLOW_FILES:
        item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(config, items):
    """The default loop leaves out the tests marked ``slow`` or ``ray``; ``--full`` or any ``-m`` runs what it says."""
    for item in items:
        _mark(item)
    if config.getoption("--full") or config.getoption("markexpr") or any("::" in arg for arg in config.args):
        return  # every test, what -m selects, or the tests named one by one
    left_out = [item for item in items if item.get_closest_marker("slow") or item.get_closest_marker("ray")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        kept = set(items) - set(left_out)
        items[:] = [item for item in items if item in kept]


# The sets the tests read; SICK-R is tested on a fixture of its own.
TEST_SETS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb")


@pytest.fixture(scope="session")
def sts_data_home() -> Path:
    """The original STS files: ``$SKFLOW_DATA``, else ``~/skflow_data``; missing sets are downloaded there."""
    from skflow.datasets import get_data_home, load_sts

    path = get_data_home().resolve()
    for name in TEST_SETS:
        try:
            load_sts(name, data_home=path)  # downloads and verifies what is missing
        except FileNotFoundError as exc:
            raise RuntimeError(f"the tests need the STS data: {exc}") from exc
    return path


def _stsb_test_embeddings(data_home, pooling):
    from skflow import BertEmbedder
    from skflow.datasets import load_sts

    test = load_sts("stsb", split="test", data_home=data_home, download_if_missing=False)
    embedder = BertEmbedder(pooling=pooling, dtype="float32", device="cpu", show_progress_bar=False)
    return embedder.transform(test.pairs), test.scores


@pytest.fixture(scope="session")
def stsb_test_mean(sts_data_home):
    """Like ``stsb_test_cls``, with mean pooling (raw Spearman ~0.82; also three constant dimensions)."""
    return _stsb_test_embeddings(sts_data_home, "mean")


@pytest.fixture(scope="session")
def stsb_test_cls(sts_data_home, tmp_path_factory):
    """Real embeddings: the STS-B test pairs through the bundled encoder, CLS pooling, float32.

    Returns ``(pairs, scores)``: pairs of shape (1379, 2, 384). CLS vectors of this encoder are
    anisotropic enough for the flow to matter (raw Spearman ~0.73), and three of their
    dimensions are constant, as with every real encoder output of this model.
    """
    return _stsb_test_embeddings(sts_data_home, "cls")
