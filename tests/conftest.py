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
# The retrieval data lies beside the STS data in the shared layout (CI: ../shared/data/{sts,retrieval})
if "SKFLOW_DATA" in os.environ and (Path(os.environ["SKFLOW_DATA"]).parent / "retrieval").is_dir():
    os.environ.setdefault("SKFLOW_RETRIEVAL_DATA", str(Path(os.environ["SKFLOW_DATA"]).parent / "retrieval"))
# Ray reads its authentication mode once per process, at the first ray.init: every instance of the session (a doc
# example's local one, the session's head, the processes the tests start) must use the same, or the head's calls
# to this process are refused ("InvalidAuthToken") and its actors die
os.environ["RAY_AUTH_MODE"] = "disabled"


def pytest_addoption(parser):
    parser.addoption(
        "--full", action="store_true",
        help="run every test, the ones marked slow or ray too (what .ci/run and the README's test command run)",
    )


_TESTS_DIR = Path(__file__).resolve().parent
_PACKAGE_DIR = str(_TESTS_DIR.parent / "skflow")
FAST_LOOP_TEST = "test_fast_loop.py"
# What the tests of the default loop did in this session: the skflow files that had a function called, and the
# tests that passed (tests/test_fast_loop.py reads them instead of running the loop a second time).
FAST_LOOP = {"called": set(), "tests": set(), "passed": set(), "failed": set(), "left_out": 0, "whole": False,
             "traced": False, "tracing": False}


def _record_call(frame, event, arg):
    """A global trace function: Python calls only (a profile function also ran for every C call, 10-20% of the fast
    tests' CPU time), and None, so that no frame is traced line by line."""
    code = frame.f_code
    if (event == "call" and FAST_LOOP["tracing"] and code.co_name != "<module>"
            and code.co_filename.startswith(_PACKAGE_DIR)):
        FAST_LOOP["called"].add(code.co_filename)


def _in_fast_loop(item) -> bool:
    return not (item.get_closest_marker("slow") or item.get_closest_marker("ray"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Trace the tests of the default loop (their fixtures included) for the skflow files they call, where the
    check reads them: the trace takes 40% of the default loop's time (68 s untraced, 95 s traced)."""
    # threads started by the test keep the trace: the flag
    traced = FAST_LOOP["tracing"] = FAST_LOOP["traced"] and _in_fast_loop(item)
    if traced:
        sys.settrace(_record_call)
        threading.settrace(_record_call)
    try:
        yield
    finally:
        FAST_LOOP["tracing"] = False
        sys.settrace(None)
        threading.settrace(None)


def pytest_runtest_logreport(report):
    if report.nodeid in FAST_LOOP["tests"] and (report.failed or report.when == "call" and report.passed):
        FAST_LOOP["failed" if report.failed else "passed"].add(report.nodeid)


def pytest_unconfigure(config):
    if path := os.environ.get("SKFLOW_TRACE_MODULES"):
        Path(path).write_text(json.dumps(sorted(FAST_LOOP["called"])))


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
    """The default loop leaves out the tests marked ``slow`` or ``ray``; ``--full`` or any ``-m`` runs what it says.

    ``tests/test_fast_loop.py`` runs last; where this session runs the whole suite, it checks the default loop's
    tests as they ran here, else it runs the loop in a process of its own."""
    for item in items:
        _mark(item)
    narrowed = config.getoption("markexpr") or config.getoption("keyword") or any("::" in arg for arg in config.args)
    FAST_LOOP["tests"] = {item.nodeid for item in items if _in_fast_loop(item)}
    FAST_LOOP["left_out"] = len(items) - len(FAST_LOOP["tests"])
    whole_folder = {Path(arg).resolve() for arg in config.args} <= {_TESTS_DIR, _TESTS_DIR.parent}
    every_file = len({item.path.name for item in items}) == len(list(_TESTS_DIR.glob("test_*.py")))
    FAST_LOOP["whole"] = not narrowed and whole_folder and every_file
    # traced where the check reads the trace: a whole --full run, or the loop it runs in a process of its own
    FAST_LOOP["traced"] = bool(os.environ.get("SKFLOW_TRACE_MODULES")
                               or FAST_LOOP["whole"] and config.getoption("--full"))
    items.sort(key=lambda item: item.path.name == FAST_LOOP_TEST)  # stable: the loop's check comes last
    if config.getoption("--full") or config.getoption("markexpr") or any("::" in arg for arg in config.args):
        return  # every test, what -m selects, or the tests named one by one
    left_out = [item for item in items if not _in_fast_loop(item)]
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


@pytest.fixture(scope="session")
def scifact():
    """BEIR SciFact's test split, verified: from ``$SKFLOW_RETRIEVAL_DATA`` (set above from the shared layout), else
    ``$SKFLOW_DATA``, else ``~/skflow_data``; downloaded there if missing."""
    from skflow.datasets import load_beir

    try:
        return load_beir("scifact")
    except FileNotFoundError as exc:
        raise RuntimeError(f"the tests need BEIR SciFact: {exc}") from exc


def _stsb_test_embeddings(data_home, pooling):
    from skflow import BertEmbedder
    from skflow.datasets import load_sts

    test = load_sts("stsb", split="test", data_home=data_home, download_if_missing=False)
    embedder = BertEmbedder(pooling=pooling, dtype="float32", device="cpu", show_progress_bar=False)
    return embedder.transform(test.pairs), test.scores


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """A Hugging Face hub cache of the test's own (``models--org--name/snapshots/<commit>``, ``refs/``), offline
    whatever the environment says: huggingface_hub reads both at each call, so this process's loads see them."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One embedding cache for the session: tests that embed the same STS sets with the same settings (the CLI's
    evaluate, the tuning study) embed them once."""
    return tmp_path_factory.mktemp("embedding-cache")


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


# ---------------------------------------------------------------------- one S3 server and one Ray head per session
S3_SECRET = "SKFLOW-TEST-SECRET-4f1c9a-do-not-print"
S3_KEY_ID = "AKIASKFLOWTESTKEY001"


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server in a thread of this process, and the variables that point a client at it (secret credentials
    that must appear in no output, error, log or written object)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": S3_KEY_ID,
           "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    server.stop()


@pytest.fixture(scope="session")
def ray_head(s3_server):
    """The address of one Ray head of 2 CPUs for the session (``ray start``, a process of its own, killed by its
    session at the end), its workers started with the S3 server's variables and this tree on PYTHONPATH. Its own
    temporary folder: Ray joins the address found in the default one (/tmp/ray) from any ``ray.init()``."""
    import subprocess
    import tempfile

    temp = tempfile.mkdtemp(prefix="skflow-ray-", dir="/tmp")  # short: Ray's socket paths must fit
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "AWS_PROFILE", "AWS_SESSION_TOKEN",
                                                             "AWS_DEFAULT_REGION")}
    path = os.pathsep.join(filter(None, [str(_TESTS_DIR.parent), env.get("PYTHONPATH")]))
    env.update(s3_server, PYTHONPATH=path)
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--num-cpus=2",
                             f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}",
                             "--disable-usage-stats", "--node-ip-address=127.0.0.1"],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        kill_sessions([head.pid])  # the head and every process it started share its session
        head.wait(timeout=30)


def session_processes(sid: int) -> list[str]:
    """The live processes of a session, ``PID b'command line'`` each (Ray's processes stay in the session of the
    driver that started them; a zombie, which only its parent can remove, is not counted)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if entry.name.isdigit() and int(fields[3]) == sid and fields[0] != "Z":
                found.append(f"{entry.name} {(entry / 'cmdline').read_bytes()[:80]!r}")
        except (OSError, ValueError):
            continue
    return found


def parse_python(source: str):
    """``ast.parse``, once more after CPython 3.11's spurious "AST constructor recursion depth mismatch" SystemError
    (python/cpython#106905: its AST constructor's depth is the interpreter's, which a long session of threads can
    upset; seen once in a full run, parsing a test file)."""
    import ast

    try:
        return ast.parse(source)
    except SystemError as exc:
        if "recursion depth mismatch" not in str(exc):
            raise
        return ast.parse(source)


def kill_sessions(sids) -> None:
    """SIGKILL every process of the sessions ``sids``, by its pid, until none is left (20 s at most)."""
    import signal
    import time

    for _ in range(100):
        left = [int(line.split()[0]) for sid in sids for line in session_processes(sid)]
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ray_instance(ray_head):
    """This process joined to the session's Ray head for one module (``ray.shutdown`` leaves the head running);
    yields the session folder, where Ray's logs are."""
    import ray

    # not log_to_driver: Ray's own lines (its GCS at shutdown, say) would mix into the stderr tested here
    ray.init(address=ray_head, logging_level="ERROR", log_to_driver=False)
    yield Path(ray._private.worker._global_node.get_session_dir_path())
    ray.shutdown()
