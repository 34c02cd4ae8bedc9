"""What an evaluation resolved to is in its results: the JSON's ``settings`` and the Markdown's ``Settings:`` line
(the dtype ``"auto"`` became, the device, the model's identity, the retrieval sets' encoder and search, the seed,
the versions), so that a reader can tell which published row a result compares with."""

import json
import platform

import numpy as np
import pytest
import sklearn
import tokenizers
import torch
import transformers
from test_fit_on import _HashedEncoder, _small_sets

import skflow
from skflow.cli import main
from skflow.embedding import _fused_bert
from skflow.evaluation import evaluate, markdown_tables
from skflow.utils import resolve_device


@pytest.mark.parametrize("bf16", [True, False], ids=["a CPU with bf16 matrix work", "a CPU without"])
def test_the_results_record_what_every_setting_resolved_to(monkeypatch, bf16):
    _small_sets(monkeypatch)
    monkeypatch.setattr(_fused_bert, "cpu_has_fast_bf16", lambda: bf16)
    encoder = _HashedEncoder(pooling="cls", device="auto")  # dtype "auto"
    results = evaluate(encoder, methods=["none", "center"], sets=["stsb", "scifact"], precisions=["float32", "binary"],
                       random_state=7, flow_params={"max_epochs": 2, "verbose": 1})  # verbose: not recorded
    settings = results["settings"]
    dtype, device = ("bfloat16" if bf16 else "float32"), str(resolve_device("auto"))
    if device != "cpu":  # a GPU decides by itself
        dtype = settings["encoder"]["dtype"]
    identity = skflow.BertEmbedder().fit([]).encoder_identity_
    assert settings["encoder"] == {
        "model": "sentence-transformers/all-MiniLM-L6-v2", "identity": identity, "revision": None,
        "pooling": "cls", "layers": [6], "max_length": 128, "dtype": dtype, "dtype_given": "auto", "device": device,
        "normalize": False, "prompt": None, "batch_size": 32}
    # the retrieval set with the encoder's own sentence-transformers settings, as MTEB runs it
    assert settings["retrieval"] == {
        "encoder": {**settings["encoder"], "pooling": "mean", "max_length": 256}, "documents": "title + ' ' + text",
        "queries": "test split", "similarity": "cosine", "search": "exact", "k": 100, "binary-rescore candidates": 100}
    assert {key: settings[key] for key in ("methods", "precisions", "random_state", "flow_params")} == {
        "methods": ["none", "center"], "precisions": ["float32", "binary"], "random_state": 7,
        "flow_params": {"max_epochs": 2}}
    assert settings["versions"] == {
        "skflow": skflow.__version__, "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "numpy": np.__version__,
        "scikit-learn": sklearn.__version__}
    line = markdown_tables(results).rstrip().splitlines()[-1]
    assert line.startswith(f"Settings: STS sets: encoder sentence-transformers/all-MiniLM-L6-v2 ({identity}), "
                           f"pooling cls (hidden states [6]), max_length 128, dtype {dtype} (given auto), device "
                           f"{device}, normalize False, prompt None; retrieval sets: encoder sentence-transformers/")
    assert ", pooling mean (hidden states [6]), max_length 256, " in line
    assert line.endswith(f"; methods none, center; precisions float32, binary; random_state 7, flow_params "
                         f"{{'max_epochs': 2}}; skflow {skflow.__version__}, python {platform.python_version()}, "
                         f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers "
                         f"{tokenizers.__version__}, numpy {np.__version__}, scikit-learn {sklearn.__version__}.")
    assert "\n" not in line


def test_the_written_files_hold_the_settings_and_a_rerun_replaces_them(monkeypatch, tmp_path, capsys):
    """The Markdown's settings line keeps the file one that evaluate recognises as its own: the same command
    again replaces it (a file with a line evaluate does not write is never replaced)."""
    _small_sets(monkeypatch)
    monkeypatch.setattr("skflow.cli.BertEmbedder", _HashedEncoder)
    out = tmp_path / "results"
    argv = ["evaluate", "--sets", "stsb", "--method", "none", "center", "--dtype", "float32", "--output", str(out),
            "--quiet"]
    assert main(argv) == 0
    written = json.loads(out.with_suffix(".json").read_text())
    assert written["settings"]["encoder"]["dtype"] == "float32" and written["config"]["dtype"] == "float32"
    table = out.with_suffix(".md").read_text()
    last = table.rstrip().splitlines()[-1]
    assert last.startswith("Settings: STS sets: encoder sentence-transformers/all-MiniLM-L6-v2 (")
    retrieval_only = evaluate(_HashedEncoder(), methods=["none"], sets=["scifact"])["settings"]
    assert "encoder" not in retrieval_only and retrieval_only["retrieval"]["encoder"]["pooling"] == "mean"
    assert main(argv) == 0, capsys.readouterr().err
    out.with_suffix(".md").write_text(table + "my notes\n")
    assert main(argv) == 2 and "results.md: exists and is not a results file" in capsys.readouterr().err
