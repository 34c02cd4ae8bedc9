"""A fitted ``BertEmbedder ->`` post-processing pipeline as a sentence-transformers folder, and its loader that runs
no code from the folder (``docs/serving.md``). Needs skflow's ``serve``
extra (sentence-transformers, onnx, onnxscript, onnxruntime)."""

import os
from pathlib import Path

import numpy as np
import torch
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted

from skflow import embedding, persistence, saved_models
from skflow.embedder import BertEmbedder
from skflow.gaussianizer import FlowGaussianizer
from skflow.utils import InvalidModelError, install_hint, temporary_sibling
from skflow.whitening import LinearPostProcessor

try:  # the core install may hold an older sentence-transformers (the bundled encoder's package asks for >= 2.2)
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Module, Normalize, Pooling, Transformer
    from sentence_transformers.util import check_version_requirements
except ImportError as exc:
    raise ImportError(
        f"skflow.serving needs sentence-transformers >= 6.2: {install_hint('serve')} ({exc})") from None

__all__ = ["FlowPooling", "export_sentence_transformer", "load_sentence_transformer"]

FLOW_FILE = "flow.skops"
LINEAR = LinearPostProcessor  # exported as a stock Dense module where the pooling allows
POST_PROCESSINGS = (FlowGaussianizer, LINEAR)
PROMPT_NAME = "default"  # the name of the embedder's prompt in config_sentence_transformers.json


class FlowPooling(Module):
    """Pool token states as `BertEmbedder` does, then map the vector through a fitted post-processing.

    Parameters
    ----------
    reduction : {"cls", "mean", "last_token", "max"}
        The first, the mean, the last or the per-dimension maximum of the real tokens (padding excluded).
    layers : list of int or None
        ``hidden_states`` indices to average (0 is the embedding layer); None uses the last layer.
    normalize : bool
        Scale the pooled vector to unit length before the post-processing.
    flow : FlowGaussianizer, Whitener, Centerer, MeanDirectionRemover or ITQRotation, optional
        The fitted post-processing (saved as ``flow.skops``); None passes the pooled vector through.
    """

    config_keys = ["reduction", "layers", "normalize"]

    def __init__(self, reduction: str, layers: list[int] | None, normalize: bool, flow=None) -> None:
        super().__init__()
        if reduction not in embedding.STOCK_MODES:  # pool would mean-pool anything but "cls"
            raise ValueError(f"unknown reduction {reduction!r}; FlowPooling knows "
                             f"{tuple(sorted(embedding.STOCK_MODES))}")
        if layers is not None and not (isinstance(layers, (list, tuple)) and layers and all(
                isinstance(layer, (int, np.integer)) and type(layer) is not bool and layer >= 0 for layer in layers)):
            raise ValueError(f"layers must be null or a non-empty list of hidden_states indices (ints >= 0), got "
                             f"{layers!r}")
        if not isinstance(normalize, (bool, np.bool_)):
            raise ValueError(f"normalize must be true or false, got {normalize!r}")
        self.reduction, self.flow = reduction, flow
        self.layers, self.normalize = layers and [int(layer) for layer in layers], bool(normalize)

    def forward(self, features: dict, **kwargs) -> dict:
        if self.layers is None:
            hidden = features["token_embeddings"].float()
        else:
            hidden = embedding.mean_of_layers(features["all_layer_embeddings"], self.layers)
        vectors = embedding.pool(hidden, features["attention_mask"], self.reduction)
        if self.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1, eps=float(np.finfo(np.float32).tiny))
        if self.flow is not None:
            latent = np.asarray(self.flow.transform(vectors.detach().cpu().numpy().astype(np.float32)))
            vectors = torch.from_numpy(latent).to(vectors.device)
        features["sentence_embedding"] = vectors
        return features

    def get_embedding_dimension(self) -> int:
        return int(getattr(self.flow, "n_components_", self.flow.n_features_in_))

    def save(self, output_path: str, *args, **kwargs) -> None:
        self.save_config(output_path)
        if self.flow is not None:
            persistence.dump(self.flow, Path(output_path) / FLOW_FILE)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs) -> "FlowPooling":
        hub = {k: kwargs[k] for k in ("token", "cache_folder", "revision", "local_files_only") if k in kwargs}
        where = Path(model_name_or_path, subfolder)
        try:
            pooling = cls(**cls.load_config(model_name_or_path, subfolder=subfolder, **hub), flow=None)
        except (OSError, TypeError, ValueError) as exc:  # the constructor's checks; other keys, not a JSON object
            raise InvalidModelError(f"{where / cls.config_file_name}: FlowPooling's configuration is refused: "
                                    f"{exc}") from None
        flow = Path(cls.load_file_path(model_name_or_path, filename=FLOW_FILE, subfolder=subfolder, **hub)
                    or where / FLOW_FILE)
        pooling.flow = persistence.load(flow)  # a missing file: an InvalidModelError naming it
        if not isinstance(pooling.flow, POST_PROCESSINGS) or not hasattr(pooling.flow, "n_features_in_"):
            fitted = "an unfitted" if isinstance(pooling.flow, POST_PROCESSINGS) else "a"
            raise InvalidModelError(f"{flow}: holds {fitted} {type(pooling.flow).__name__}, not a fitted "
                                    "FlowGaussianizer, Whitener, Centerer, MeanDirectionRemover or ITQRotation")
        return pooling


def export_sentence_transformer(pipeline: Pipeline, path: str | os.PathLike) -> Path:
    """Write a fitted ``BertEmbedder ->`` post-processing pipeline as a sentence-transformers model.

    The folder's ``encode(texts)`` returns the pipeline's vectors (float32), with the encoder of fit. A linear map
    after a pooling that sentence-transformers' ``Pooling`` expresses is written in its own modules (no remote code
    to load it); anything else uses :class:`FlowPooling` (load it with :func:`load_sentence_transformer`). The
    ``prompt`` becomes the folder's default prompt; ``token`` is written nowhere. See ``docs/serving.md``.

    Parameters
    ----------
    pipeline : Pipeline
        A fitted pipeline of two steps: a `BertEmbedder`, then a fitted
        `FlowGaussianizer`, `Whitener`, `Centerer`, `MeanDirectionRemover` or `ITQRotation`.
    path : str or path-like
        The folder to write (``~`` expanded); it must not exist or be empty.

    Returns
    -------
    path : pathlib.Path

    Raises
    ------
    skflow.EncoderChangedError
        The embedder's encoder files changed since it was fitted.
    ValueError
        The encoder needs remote code (``trust_remote_code=True``).
    """
    steps = [step for _, step in pipeline.steps] if isinstance(pipeline, Pipeline) else [pipeline]
    if len(steps) != 2 or not (isinstance(steps[0], BertEmbedder) and isinstance(steps[1], POST_PROCESSINGS)):
        raise TypeError("export_sentence_transformer takes a pipeline of a BertEmbedder then a FlowGaussianizer, "
                        "a Whitener, a Centerer, a MeanDirectionRemover or an ITQRotation; got "
                        f"{', '.join(type(s).__name__ for s in steps)}")
    embedder, post = steps
    check_is_fitted(post)
    embedder._validate_params()
    out = Path(path).expanduser()
    if out.is_symlink() or out.exists() and (not out.is_dir() or any(out.iterdir())):  # a link would be replaced
        raise FileExistsError(f"{out}: exists and is not an empty folder (a link never is): give a new folder")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"{out}: the folder to write it in, {out.parent}, does not exist or is not a folder")
    if embedder.trust_remote_code:
        raise ValueError("the encoder needs remote code (trust_remote_code=True), which the folder's loaders never "
                         "run: serve the pipeline with skflow.dump instead")
    settings = embedding.encoder_settings(embedder, device="cpu", encoding=False)  # loaded on the CPU, whole
    if post.n_features_in_ != settings.dim:
        raise ValueError(f"the {type(post).__name__} takes {post.n_features_in_} features, the encoder gives "
                         f"{settings.dim}")
    source, last = settings.source, settings.stock_mode is not None  # stock modes pool the last layer alone
    stock = last and isinstance(post, LINEAR)
    # for the model, its config and tokenizer; the token loads it and is never written (nor by sentence-transformers)
    pinned = {**({"revision": source.revision} if source.revision else {}), **dict(settings.hub)}
    placement = {"device_map", "max_memory", "low_cpu_mem_usage"}
    loading = {k: v for k, v in settings.model_kwargs.items() if k not in placement}
    with embedding.quiet_transformers():
        transformer = Transformer(source.path_or_id, max_seq_length=settings.max_length,
                                  model_kwargs={**pinned, **loading}, processor_kwargs=dict(pinned),
                                  config_kwargs={**pinned, **({} if last else {"output_hidden_states": True})})
        tokenizer = transformer.tokenizer
        tokenizer.padding_side = "right"  # every real token keeps its unpadded position
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None:
                raise ValueError("the tokenizer has neither a padding token nor an EOS token to pad batches with: "
                                 "give it one (tokenizer.pad_token = ...; save it) and refit")
            tokenizer.pad_token = tokenizer.eos_token
        if stock:  # Pooling, Normalize (before the map, as skflow does), a Dense of x @ matrix + bias
            matrix, bias = (torch.from_numpy(array.astype(np.float32)) for array in post.linear_map())
            dense = Dense(*matrix.shape, activation_function=torch.nn.Identity(), init_weight=matrix.T, init_bias=bias)
            modules = [Pooling(settings.dim, settings.stock_mode), *[Normalize()] * settings.normalize, dense]
        else:
            modules = [FlowPooling(settings.reduction, None if last else [*settings.layers], settings.normalize, post)]
        with temporary_sibling(out, folder=True) as staging:  # never a half-written model folder at ``out``
            prompts = dict.fromkeys((PROMPT_NAME, "query", "document"), settings.prompt)  # every encode_*
            default = {"prompts": prompts, "default_prompt_name": PROMPT_NAME} if settings.prompt else {}
            SentenceTransformer(modules=[transformer, *modules], device="cpu", **default).save(str(staging))
            if stock:
                saved_models.write_interoperable_configs(staging, settings.stock_mode, settings.dim,
                                                         settings.max_length)
            os.rename(staging, out)  # onto nothing or an empty folder; a folder filled meanwhile fails it
    return out


def load_sentence_transformer(path: str | os.PathLike, **kwargs) -> SentenceTransformer:
    """Load a folder written by :func:`export_sentence_transformer` without running any code from it.

    The folder must hold a layout skflow writes; the modules are built here (no remote code, safetensors only) and
    handed to ``SentenceTransformer(modules=[...])``. Every setting of the folder is honoured as
    ``SentenceTransformer(path)`` honours it, or refused; ``kwargs`` win. See ``docs/serving.md`` for every check.

    Parameters
    ----------
    path : str or path-like
        The folder; ``~`` is expanded.
    **kwargs
        Passed to ``SentenceTransformer``.

    Returns
    -------
    model : SentenceTransformer

    Raises
    ------
    skflow.persistence.UntrustedTypeError
        ``modules.json`` names another module class.
    skflow.persistence.InvalidModelError
        The folder is not one skflow writes; the message names the file.

    Examples
    --------
    >>> import tempfile, skflow.serving
    >>> skflow.serving.load_sentence_transformer(tempfile.mkdtemp())
    Traceback (most recent call last):
    skflow.persistence.InvalidModelError: .../modules.json: missing; not a folder written by ...
    """
    if refused := sorted({"trust_remote_code", "modules", "model_name_or_path"} & set(kwargs)):
        raise TypeError(f"load_sentence_transformer builds the modules itself and never runs code from the folder; "
                        f"it takes no {', '.join(refused)}")
    folder = saved_models.check_folder(path)
    settings = dict(folder.model_settings)
    check_version_requirements(settings.pop("requirements", None), source=str(path))
    kwargs = {**settings, **kwargs}  # the caller's arguments first, as sentence-transformers has them
    if folder.dense is not None:
        modules, layers = saved_models.load_stock_modules(folder), None
        where, takes = folder.pooling / "config.json", modules[0].embedding_dimension
    else:
        modules = [FlowPooling.load(str(folder.pooling), local_files_only=True)]
        where, takes, layers = folder.pooling / FLOW_FILE, modules[0].flow.n_features_in_, modules[0].layers
    try:
        with embedding.quiet_transformers():  # trust_remote_code=False and local_files_only go to each loader
            transformer = Transformer.load(str(folder.transformer), local_files_only=True, trust_remote_code=False,
                                           model_kwargs={"use_safetensors": True},  # no pickled .bin weights
                                           config_kwargs={"output_hidden_states": True} if layers else None)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        first_line = str(exc).partition("\n")[0]
        raise InvalidModelError(f"{folder.transformer}: the encoder cannot be loaded without code from the folder or "
                                f"files it lacks ({type(exc).__name__}: {first_line})") from None
    n_hidden, width = embedding.n_hidden_layers(transformer.auto_model.config), transformer.get_embedding_dimension()
    if layers is not None and max(layers) > n_hidden:
        raise InvalidModelError(f"{folder.pooling / 'config.json'}: layers {layers} do not exist; the encoder has "
                                f"hidden_states 0 to {n_hidden}")
    if takes != width:
        raise InvalidModelError(f"{where}: the post-processing takes {takes} features, the encoder gives {width}")
    limit = embedding.position_limit(transformer.auto_model.config, transformer.auto_model)
    saved_models.check_numbers(folder, limit, modules[-1].get_embedding_dimension())
    if limit is not None and not 1 <= (transformer.max_seq_length or limit + 1) <= limit:
        # none set: sentence-transformers takes min(max_position_embeddings, the tokenizer's model_max_length),
        # which counts a RoBERTa-like table's reserved positions, or none at all (no truncation): IndexError at encode
        transformer.max_seq_length = limit
    return SentenceTransformer(modules=[transformer, *modules], **kwargs)
