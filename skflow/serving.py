"""A fitted ``BertEmbedder -> FlowGaussianizer`` pipeline as a sentence-transformers model folder.

:func:`export_sentence_transformer` writes a folder that
``SentenceTransformer(path, trust_remote_code=True).encode(texts)`` loads and
runs with nothing imported but sentence-transformers (skflow installed; since
sentence-transformers 6 any module class outside its namespace needs
``trust_remote_code=True``, and :func:`load_sentence_transformer` checks the
folder before passing it): module 0 is
sentence-transformers' own ``Transformer`` (a copy of the encoder and its
tokenizer, truncating at the embedder's ``max_length``), module 1 is
:class:`FlowPooling`, skflow's module, which pools exactly as the embedder
does (``cls``, ``mean``, ``first_last_avg``, ``last_two_avg`` or the
``layers`` option, which sentence-transformers' ``Pooling`` cannot express)
and applies the flow. The flow is stored as a ``.skops`` file inside the
folder and read with :func:`skflow.load`, so loading a folder from somebody
else runs no code from it (see ``docs/serving.md``).

Needs the ``serve`` extra: ``pip install "skflow[serve]"``.
"""

import os
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules.module import Module
from sentence_transformers.base.modules.transformer import Transformer
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted

from skflow import _encoding, persistence
from skflow._model_source import resolve_model_source
from skflow.embedder import BertEmbedder
from skflow.gaussianizer import FlowGaussianizer

__all__ = ["FlowPooling", "export_sentence_transformer", "load_sentence_transformer"]

FLOW_FILE = "flow.skops"


class FlowPooling(Module):
    """Pool token states as `BertEmbedder` does, then map the vector through a fitted flow.

    Parameters
    ----------
    reduction : {"cls", "mean"}
        The first token, or the mean over real tokens (padding excluded).
    layers : list of int or None
        ``hidden_states`` indices to average (0 is the embedding layer);
        None uses the last layer.
    normalize : bool
        Scale the pooled vector to unit length before the flow.
    flow : FlowGaussianizer, optional
        The fitted flow; None passes the pooled vector through.
    """

    config_keys = ["reduction", "layers", "normalize"]

    def __init__(self, reduction: str, layers: list[int] | None, normalize: bool, flow=None) -> None:
        super().__init__()
        self.reduction = reduction
        self.layers = None if layers is None else [int(layer) for layer in layers]
        self.normalize = bool(normalize)
        self.flow = flow

    def forward(self, features: dict, **kwargs) -> dict:
        mask = features["attention_mask"]
        if self.layers is None:
            hidden = features["token_embeddings"].float()
        else:
            hidden = _encoding.mean_of_layers(features["all_layer_embeddings"], self.layers)
        vectors = _encoding.pool(hidden, mask, self.reduction)
        if self.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1, eps=float(np.finfo(np.float32).tiny))
        if self.flow is not None:
            latent = self.flow.transform(vectors.detach().cpu().numpy().astype(np.float32))
            vectors = torch.from_numpy(latent).to(vectors.device)
        features["sentence_embedding"] = vectors
        return features

    def get_embedding_dimension(self) -> int:
        return int(self.flow.n_features_in_)

    get_sentence_embedding_dimension = get_embedding_dimension  # the name before sentence-transformers 6

    def save(self, output_path: str, *args, **kwargs) -> None:
        self.save_config(output_path)
        if self.flow is not None:
            persistence.dump(self.flow, Path(output_path) / FLOW_FILE)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs) -> "FlowPooling":
        hub = {k: kwargs[k] for k in ("token", "cache_folder", "revision", "local_files_only") if k in kwargs}
        config = cls.load_config(model_name_or_path, subfolder=subfolder, **hub)
        flow_path = cls.load_file_path(model_name_or_path, filename=FLOW_FILE, subfolder=subfolder, **hub)
        flow = persistence.load(flow_path) if flow_path else None
        if flow is not None and not isinstance(flow, FlowGaussianizer):
            raise persistence.InvalidModelError(f"{flow_path}: holds a {type(flow).__name__}, not a FlowGaussianizer")
        return cls(**{key: config[key] for key in cls.config_keys}, flow=flow)


def export_sentence_transformer(pipeline: Pipeline, path: str | os.PathLike) -> Path:
    """Write a fitted ``make_pipeline(BertEmbedder(...), FlowGaussianizer())`` as a sentence-transformers folder.

    ``SentenceTransformer(path, trust_remote_code=True).encode(texts)`` (or
    :func:`load_sentence_transformer`, which checks the folder first) then
    returns the pipeline's latent vectors (float32; the encoder in float32).

    Parameters
    ----------
    pipeline : Pipeline
        A fitted pipeline of two steps: a `BertEmbedder`, then a fitted
        `FlowGaussianizer`.
    path : str or path-like
        The folder to write (``~`` expanded); it must not exist or be empty.

    Returns
    -------
    path : pathlib.Path

    Examples
    --------
    >>> import tempfile
    >>> from sentence_transformers import SentenceTransformer
    >>> from sklearn.pipeline import make_pipeline
    >>> from skflow import BertEmbedder, FlowGaussianizer, export_sentence_transformer
    >>> from skflow.datasets import load_sts
    >>> texts = load_sts("stsb", split="dev").pairs[:200].ravel()
    >>> pipe = make_pipeline(BertEmbedder(pooling="first_last_avg", dtype="float32"),
    ...                      FlowGaussianizer(random_state=0)).fit(texts)
    >>> folder = export_sentence_transformer(pipe, tempfile.mkdtemp() + "/model")
    >>> SentenceTransformer(str(folder), trust_remote_code=True).encode(list(texts[:3])).shape
    (3, 384)
    """
    embedder, flow = _check_pipeline(pipeline)
    out = Path(path).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: exists and is not an empty folder")
    source = resolve_model_source(embedder.model_name_or_path, embedder.revision)
    n_hidden = _encoding.n_hidden_layers(_encoding.load_config(*source))
    reduction, layers = _encoding.resolve_pooling(embedder.pooling, embedder.layers, n_hidden)
    last = layers == (n_hidden,)
    with _encoding.quiet_transformers():
        transformer = Transformer(
            source.path_or_id,
            max_seq_length=embedder.max_length,
            model_kwargs={"revision": source.revision} if source.revision else None,
            config_kwargs=None if last else {"output_hidden_states": True},
        )
        pooling = FlowPooling(reduction, None if last else list(layers), embedder.normalize, flow)
        SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(out))
    return out


def load_sentence_transformer(path: str | os.PathLike, **kwargs) -> SentenceTransformer:
    """Load a folder written by :func:`export_sentence_transformer`, after checking that it is one.

    Since sentence-transformers 6, a module outside its own namespace (here
    :class:`FlowPooling`) loads only with ``trust_remote_code=True``, which
    would also let the folder name any other class, or the encoder's
    ``config.json`` pull modeling code from the folder. This loader allows
    exactly sentence-transformers' ``Transformer`` and skflow's
    ``FlowPooling``, refuses custom code in the folder, and then loads it
    with ``trust_remote_code=True``; the flow itself is read with
    :func:`skflow.load`. ``kwargs`` go to ``SentenceTransformer``.

    Raises
    ------
    skflow.persistence.UntrustedTypeError
        The folder names another module class, or holds custom model code.
    """
    import json

    folder = Path(path).expanduser()
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    allowed = {"sentence_transformers.models.Transformer", f"{FlowPooling.__module__}.{FlowPooling.__qualname__}"}
    allowed |= {f"{Transformer.__module__}.{Transformer.__qualname__}"}
    others = [m.get("type") for m in modules if m.get("type") not in allowed]
    code = sorted(p.name for p in folder.rglob("*.py"))
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if others or code or "auto_map" in config:
        found = others + code + (["auto_map in config.json"] if "auto_map" in config else [])
        raise persistence.UntrustedTypeError(
            f"{folder}: not a folder written by skflow.export_sentence_transformer; it names or holds {found}"
        )
    return SentenceTransformer(str(folder), trust_remote_code=True, **kwargs)


def _check_pipeline(pipeline) -> tuple[BertEmbedder, FlowGaussianizer]:
    steps = getattr(pipeline, "steps", None)
    if not isinstance(pipeline, Pipeline) or len(steps) != 2:
        raise TypeError(
            "export_sentence_transformer takes a pipeline of two steps, BertEmbedder then FlowGaussianizer, "
            f"e.g. make_pipeline(BertEmbedder(), FlowGaussianizer()); got {type(pipeline).__name__}"
        )
    embedder, flow = steps[0][1], steps[1][1]
    if not isinstance(embedder, BertEmbedder) or not isinstance(flow, FlowGaussianizer):
        raise TypeError(
            "export_sentence_transformer takes a pipeline whose first step is a BertEmbedder and second a "
            f"FlowGaussianizer; got {type(embedder).__name__}, {type(flow).__name__}"
        )
    check_is_fitted(flow)
    embedder._validate_params()
    return embedder, flow
