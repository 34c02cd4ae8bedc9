"""A whitened pipeline in sentence-transformers' own modules: ``Transformer, Pooling, [Normalize,] Dense``.

A fitted `Whitener` is the affine map ``x -> (x - mean_) @ (components_.T *
scale_)``, which is exactly what a ``Dense`` with identity activation
computes: ``x @ W.T + b`` with ``W = (components_.T * scale_).T`` and ``b =
-mean_ @ components_.T * scale_``, in float32. Folders of these modules load
with plain ``SentenceTransformer(path)`` (no ``trust_remote_code``) and in
servers that know only stock modules. The files are written in the format
that every sentence-transformers release and Text Embeddings Inference read:
module types ``sentence_transformers.models.X``, the pooling as one boolean
per mode, ``max_seq_length`` in ``sentence_bert_config.json``.

sentence-transformers (the ``serve`` extra) is imported only when these
modules are built: ``skflow.load`` and ``import skflow`` do without it.
"""

import json
from pathlib import Path

import numpy as np
import torch

from skflow.saved_models._st_folder import LEGACY_POOLING_MODES, ExportedFolder, read_dense_weights
from skflow.utils import InvalidModelError
from skflow.whitening import Whitener


def stock_modules(whitener: Whitener, dimension: int, reduction: str, normalize: bool) -> list[torch.nn.Module]:
    """``Pooling``, ``Normalize`` when the embedder normalizes (before the whitening, as skflow does), ``Dense``."""
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling

    weight = (whitener.components_.T * whitener.scale_).T
    bias = -(whitener.mean_ @ weight.T)
    dense = Dense(
        whitener.n_features_in_, whitener.n_components_, bias=True, activation_function=torch.nn.Identity(),
        init_weight=torch.from_numpy(weight.astype(np.float32)), init_bias=torch.from_numpy(bias.astype(np.float32)),
    )
    return [Pooling(dimension, reduction), *([Normalize()] if normalize else []), dense]


def write_interoperable_configs(folder: Path, reduction: str, dimension: int, max_seq_length: int) -> None:
    """Rewrite what sentence-transformers saved in the format every reader knows (see the module docstring)."""
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    for module in modules:
        module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[1]
    _write_json(folder / "modules.json", modules)
    pooling = next(folder / m["path"] for m in modules if m["type"].endswith(".Pooling"))
    modes = {f"pooling_mode_{key}": mode == reduction for key, mode in LEGACY_POOLING_MODES.items()}
    _write_json(pooling / "config.json", {"word_embedding_dimension": dimension, **modes, "include_prompt": True})
    transformer = folder / "sentence_bert_config.json"
    config = json.loads(transformer.read_text(encoding="utf-8"))
    for key in ("max_seq_length", "do_lower_case"):
        config.pop(key, None)
    _write_json(transformer, {"max_seq_length": int(max_seq_length), "do_lower_case": False, **config})


def load_stock_modules(folder: ExportedFolder, encoder_dimension: int) -> list[torch.nn.Module]:
    """The checked ``Pooling``, ``Normalize`` and ``Dense`` of ``folder``, built here (nothing imported by name)."""
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling

    config, dense = folder.pooling_config, folder.dense_config
    if config["dimension"] != encoder_dimension:
        raise InvalidModelError(f"{folder.pooling / 'config.json'}: the pooling takes {config['dimension']} "
                                f"features, the encoder gives {encoder_dimension}")
    weight, bias = read_dense_weights(folder.dense, dense)
    linear = Dense(dense["in_features"], dense["out_features"], bias=dense["bias"],
                   activation_function=torch.nn.Identity(), init_weight=weight, init_bias=bias)
    pooling = Pooling(config["dimension"], config["reduction"], include_prompt=config["include_prompt"])
    return [pooling, *([Normalize()] if config["normalize"] else []), linear]


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
