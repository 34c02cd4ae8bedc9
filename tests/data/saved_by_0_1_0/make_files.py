"""How the files beside this script were made, by skflow 0.1.0 (commit 281426f); kept for the record, not run by tests.

    SKFLOW_DATA=... HF_HUB_OFFLINE=1 python tests/data/saved_by_0_1_0/make_files.py OUT

writes pipeline.joblib, pipeline.skops, latent.npy (the pipeline's transform of texts.json) and a
sentence-transformers export; of the export, the folder sentence_transformer/ keeps every file but
the encoder's weights and tokenizer.json, which tests/test_saved_models.py re-creates from the
bundled encoder (they are a copy of it).
"""

import json
import sys
from pathlib import Path

import joblib
import numpy as np
from sklearn.pipeline import make_pipeline

import skflow
from skflow import BertEmbedder, FlowGaussianizer
from skflow.datasets import load_sts

out = Path(sys.argv[1])
out.mkdir(exist_ok=True)
texts = load_sts("stsb", split="dev").pairs[:150].ravel()
probe = list(load_sts("stsb", split="test").pairs[:8].ravel())
embedder = BertEmbedder(pooling="first_last_avg", dtype="float32", show_progress_bar=False)
pipe = make_pipeline(embedder, FlowGaussianizer(random_state=0)).fit(texts)
joblib.dump(pipe, out / "pipeline.joblib")
skflow.dump(pipe, out / "pipeline.skops")
np.save(out / "latent.npy", pipe.transform(probe))
(out / "texts.json").write_text(json.dumps(probe, indent=1))
skflow.export_sentence_transformer(pipe, out / "sentence_transformer")
