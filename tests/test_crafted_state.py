"""Crafted ``.skops`` states that passed the loaders' checks: a sparse-matrix bomb, shadowed methods, a
non-estimator at the top, extreme Whitener and flow states. Crafted files load in a subprocess under an
address-space limit and a timeout, as in ``tests/test_untrusted_files.py``."""

import copy
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import skflow
from skflow import FlowGaussianizer
from skflow.persistence import InvalidModelError
from skflow.synthetic import make_anisotropic_mixture

REPO = Path(__file__).resolve().parents[1]
MEASURE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
import skflow
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    skflow.load(sys.argv[1])
    outcome = ["loaded", ""]
except Exception as exc:
    outcome = [type(exc).__name__, str(exc)]
print(json.dumps(outcome + [(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024]))
"""


def _load_measured(path):
    """``[exception name or "loaded", message, peak memory growth in MiB]``, under 3 GiB, in 120 s."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _read(path):
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    return json.loads(members.pop("schema.json")), members


def _write(path, schema, members):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("schema.json", json.dumps(schema))
    return path


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def X():
    return make_anisotropic_mixture(300, 8, random_state=0)


@pytest.fixture(scope="module")
def pipe_file(tmp_path_factory, X):
    pipe = make_pipeline(StandardScaler(), FlowGaussianizer(random_state=0, max_epochs=1)).fit(X)
    return skflow.dump(pipe, tmp_path_factory.mktemp("pipe") / "pipe.skops")


# ---------------------------------------------------------------- finding: npz read before the size limit
def test_a_sparse_matrix_member_padded_to_400_mb_is_refused_without_reading_it(tmp_path, pipe_file):
    schema, members = _read(pipe_file)
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data.npy", _npy(np.zeros(1)))
    scaler = schema["content"]["content"]["steps"]["content"][0]["content"][1]
    scaler["content"]["content"]["evil_"] = {"__class__": "csr_matrix", "__module__": "scipy.sparse",
                                             "__loader__": "SparseMatrixNode", "type": "scipy",
                                             "file": "evil.npz", "__id__": 12345}
    members["evil.npz"] = inner.getvalue() + bytes(400 * 2**20)  # deflates to well under a megabyte
    path = _write(tmp_path / "bomb.skops", schema, members)
    assert path.stat().st_size < 2**20
    name, message, growth = _load_measured(path)
    assert name == "InvalidModelError" and "the archive declares" in message and "more than" in message
    assert growth < 100  # before: the member was read whole (400 MB) before the limit was checked
