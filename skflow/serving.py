"""A fitted ``BertEmbedder -> FlowGaussianizer`` or ``-> Whitener`` pipeline as a sentence-transformers folder.

:func:`export_sentence_transformer` writes sentence-transformers' own
``Transformer`` (a copy of the encoder the embedder was fitted on, and its
tokenizer, truncating at the embedder's ``max_length``), then either

- for a `Whitener` after ``cls``, ``mean``, ``last_token`` or ``max`` pooling of the last layer:
  sentence-transformers' own ``Pooling``, ``Normalize`` (with ``normalize=True``) and ``Dense``
  (identity activation; the whitening as its weight and bias), so plain ``SentenceTransformer(path)`` loads it
  without ``trust_remote_code`` and servers that run only stock modules
  serve it (see ``skflow.saved_models._st_stock``);
- otherwise :class:`FlowPooling`, skflow's module, which pools exactly as
  the embedder does (``first_last_avg``, ``last_two_avg`` or the ``layers``
  option, which sentence-transformers' ``Pooling`` cannot express) and
  applies the fitted post-processing (the flow or the whitener), stored as a
  ``.skops`` file read with :func:`skflow.load`.

:func:`load_sentence_transformer` loads either without running any code
from the folder: it builds the modules itself, transformers told never to
run remote code, and refuses a folder that names anything else. Plain
``SentenceTransformer(path, trust_remote_code=True)`` also loads a
``FlowPooling`` folder (since sentence-transformers 6 a module outside its
namespace needs the flag), but that flag lets the folder run code; see
``docs/serving.md``.

Needs the ``serve`` extra: ``pip install "skflow[serve]"``.
"""

import os
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules.module import Module
from sentence_transformers.base.modules.transformer import Transformer
from sentence_transformers.util import check_version_requirements
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted

from skflow import persistence
from skflow.embedder import BertEmbedder
from skflow.embedding import (
    check_model_kwargs,
    check_prompt,
    hidden_size,
    hub_kwargs,
    load_config,
    mean_of_layers,
    n_hidden_layers,
    pinned_model_source,
    pool,
    quiet_transformers,
    resolve_pooling,
)
from skflow.gaussianizer import FlowGaussianizer
from skflow.saved_models import (
    REDUCTIONS,
    STOCK_MODES,
    ExportedFolder,
    check_folder,
    check_pooling_config,
    load_stock_modules,
    stock_modules,
    write_interoperable_configs,
)
from skflow.utils import folder_created_atomically
from skflow.whitening import Whitener

__all__ = ["FlowPooling", "export_sentence_transformer", "load_sentence_transformer"]

FLOW_FILE = "flow.skops"
PROMPT_NAME = "default"  # the name of the embedder's prompt in config_sentence_transformers.json


class FlowPooling(Module):
    """Pool token states as `BertEmbedder` does, then map the vector through a fitted post-processing.

    Parameters
    ----------
    reduction : {"cls", "mean", "last_token", "max"}
        The first real token, the mean over real tokens, the last real token,
        or the per-dimension maximum over real tokens (padding excluded, on
        either side).
    layers : list of int or None
        ``hidden_states`` indices to average (0 is the embedding layer);
        None uses the last layer.
    normalize : bool
        Scale the pooled vector to unit length before the post-processing.
    flow : FlowGaussianizer or Whitener, optional
        The fitted post-processing (stored as ``flow.skops`` whichever it
        is); None passes the pooled vector through.
    """

    config_keys = ["reduction", "layers", "normalize"]

    def __init__(self, reduction: str, layers: list[int] | None, normalize: bool, flow=None) -> None:
        super().__init__()
        if reduction not in REDUCTIONS:  # pool would mean-pool anything but "cls"
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.reduction = reduction
        self.layers = None if layers is None else [int(layer) for layer in layers]
        self.normalize = bool(normalize)
        self.flow = flow

    def forward(self, features: dict, **kwargs) -> dict:
        mask = features["attention_mask"]
        if self.layers is None:
            hidden = features["token_embeddings"].float()
        else:
            hidden = mean_of_layers(features["all_layer_embeddings"], self.layers)
        vectors = pool(hidden, mask, self.reduction)
        if self.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1, eps=float(np.finfo(np.float32).tiny))
        if self.flow is not None:
            latent = self.flow.transform(vectors.detach().cpu().numpy().astype(np.float32))
            vectors = torch.from_numpy(latent).to(vectors.device)
        features["sentence_embedding"] = vectors
        return features

    def get_embedding_dimension(self) -> int:
        return int(self.flow.n_components_ if isinstance(self.flow, Whitener) else self.flow.n_features_in_)

    get_sentence_embedding_dimension = get_embedding_dimension  # the name before sentence-transformers 6

    def save(self, output_path: str, *args, **kwargs) -> None:
        self.save_config(output_path)
        if self.flow is not None:
            persistence.dump(self.flow, Path(output_path) / FLOW_FILE)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs) -> "FlowPooling":
        hub = {k: kwargs[k] for k in ("token", "cache_folder", "revision", "local_files_only") if k in kwargs}
        config = cls.load_config(model_name_or_path, subfolder=subfolder, **hub)
        where = Path(model_name_or_path, subfolder, cls.config_file_name)
        config = check_pooling_config(config, where)
        flow_path = cls.load_file_path(model_name_or_path, filename=FLOW_FILE, subfolder=subfolder, **hub)
        if not flow_path:
            raise persistence.InvalidModelError(f"{where.parent / FLOW_FILE}: missing; FlowPooling needs its flow")
        return cls(**config, flow=_load_post_processing(flow_path))


def export_sentence_transformer(pipeline: Pipeline, path: str | os.PathLike) -> Path:
    """Write a fitted ``BertEmbedder -> FlowGaussianizer`` or ``-> Whitener`` pipeline as a sentence-transformers model.

    The folder's ``encode(texts)`` returns the pipeline's output vectors
    (float32; the encoder in float32). Its encoder is the one the embedder
    was fitted on: a hub model at the commit recorded at fit (wherever its
    branch points now), a local folder only if its files are still those of
    fit.

    - A `Whitener` after ``cls``, ``mean``, ``last_token`` or ``max`` pooling of the last layer (with
      or without ``normalize``) is written in sentence-transformers' own
      modules only: ``Transformer``, ``Pooling``, ``Normalize`` (when the
      embedder normalizes: before the whitening, as skflow does) and a
      ``Dense`` with identity activation holding the whitening as its weight
      and bias, in float32. ``SentenceTransformer(path)`` loads it without
      ``trust_remote_code``, and servers that run only stock modules can
      serve it.
    - Any other pooling (``first_last_avg``, ``last_two_avg``, ``layers``),
      and a `FlowGaussianizer`, use ``Transformer`` then skflow's
      :class:`FlowPooling`, which holds the fitted post-processing as a
      ``.skops`` file: load it with :func:`load_sentence_transformer`, or
      ``SentenceTransformer(path, trust_remote_code=True)`` if you wrote it.

    The embedder's ``prompt`` becomes the folder's default prompt (and its
    ``query`` and ``document`` prompts) in ``config_sentence_transformers.json``.
    The tokenizer is saved padding on the right, with its EOS token as the
    padding token if it has none. ``token`` is written nowhere. An encoder
    with ``trust_remote_code=True`` is refused (loaders would build another class).

    Parameters
    ----------
    pipeline : Pipeline
        A fitted pipeline of two steps: a `BertEmbedder`, then a fitted
        `FlowGaussianizer` or `Whitener`.
    path : str or path-like
        The folder to write (``~`` expanded); it must not exist or be empty.

    Returns
    -------
    path : pathlib.Path

    Raises
    ------
    skflow.EncoderChangedError
        The embedder's encoder files changed since it was fitted.

    Examples
    --------
    >>> import tempfile
    >>> from sentence_transformers import SentenceTransformer
    >>> from sklearn.pipeline import make_pipeline
    >>> from skflow import BertEmbedder, FlowGaussianizer, Whitener, export_sentence_transformer
    >>> from skflow.datasets import load_sts
    >>> texts = load_sts("stsb", split="dev").pairs[:200].ravel()
    >>> pipe = make_pipeline(BertEmbedder(pooling="first_last_avg", dtype="float32"),
    ...                      FlowGaussianizer(random_state=0)).fit(texts)
    >>> folder = export_sentence_transformer(pipe, tempfile.mkdtemp() + "/model")
    >>> SentenceTransformer(str(folder), trust_remote_code=True).encode(list(texts[:3])).shape
    (3, 384)
    >>> whitened = make_pipeline(BertEmbedder(pooling="cls", dtype="float32"), Whitener(n_components=256)).fit(texts)
    >>> stock = export_sentence_transformer(whitened, tempfile.mkdtemp() + "/model")
    >>> SentenceTransformer(str(stock)).encode(list(texts[:3])).shape   # stock modules: no remote code
    (3, 256)
    """
    embedder, post = _check_pipeline(pipeline)
    out = Path(path).expanduser()
    if out.is_symlink():  # the folder is renamed into place: a link would be replaced, not written through
        raise FileExistsError(f"{out}: is a symbolic link; give a new folder, or an empty one that is not a link")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: exists and is not an empty folder")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"{out}: the folder to write it in, {out.parent}, does not exist or is not a folder")
    source = pinned_model_source(embedder.model_name_or_path, embedder.revision,
                                 getattr(embedder, "encoder_identity_", None), embedder.token)
    check_prompt(embedder.prompt)
    if embedder.trust_remote_code:
        raise ValueError("the encoder needs remote code (trust_remote_code=True): loaders of the folder would build "
                         "transformers' own class, giving other vectors; serve the pipeline with skflow.dump instead")
    hub = dict(hub_kwargs(embedder.trust_remote_code, embedder.token))
    config = load_config(*source, tuple(hub.items()))
    n_hidden, width = n_hidden_layers(config), hidden_size(config)
    if post.n_features_in_ != width:
        raise ValueError(f"the {type(post).__name__} takes {post.n_features_in_} features, the encoder gives {width}")
    reduction, layers = resolve_pooling(embedder.pooling, embedder.layers, n_hidden)
    last = layers == (n_hidden,)
    stock = last and isinstance(post, Whitener) and reduction in STOCK_MODES
    pinned = {"revision": source.revision} if source.revision else {}  # the model, its config and its tokenizer
    pinned.update(hub)  # trust_remote_code and token: used to load, never written (sentence-transformers saves neither)
    placement = {"device_map", "max_memory", "low_cpu_mem_usage"}  # the export is loaded on the CPU, whole
    loading = {k: v for k, v in check_model_kwargs(embedder.model_kwargs).items() if k not in placement}
    with quiet_transformers():
        transformer = Transformer(
            source.path_or_id,
            max_seq_length=embedder.max_length,
            model_kwargs={**pinned, **loading},
            processor_kwargs=dict(pinned),
            config_kwargs={**pinned, **({} if last else {"output_hidden_states": True})},
        )
        _pad_on_the_right(transformer.tokenizer)
        if stock:
            modules = stock_modules(post, width, STOCK_MODES[reduction], embedder.normalize)
        else:
            modules = [FlowPooling(reduction, None if last else list(layers), embedder.normalize, post)]
        with folder_created_atomically(out) as staging:  # never a half-written model folder at ``out``
            SentenceTransformer(modules=[transformer, *modules], device="cpu", **_prompts(embedder.prompt)).save(
                str(staging))
            if stock:
                write_interoperable_configs(staging, STOCK_MODES[reduction], width, embedder.max_length)
    return out


def load_sentence_transformer(path: str | os.PathLike, **kwargs) -> SentenceTransformer:
    """Load a folder written by :func:`export_sentence_transformer` without running any code from it.

    The folder is checked (``modules.json`` must list exactly
    sentence-transformers' ``Transformer`` then skflow's ``FlowPooling``, or
    ``Transformer``, ``Pooling``, optionally ``Normalize``, then ``Dense``,
    at paths inside the folder; each module's configuration must be one
    skflow writes: ``cls``, ``mean``, ``lasttoken`` or ``max`` pooling, a ``Dense`` with identity
    activation), then the modules are built here and handed to
    ``SentenceTransformer(modules=[...])``: the encoder, its configuration
    and its tokenizer are loaded by transformers with
    ``trust_remote_code=False`` (an ``auto_map`` anywhere in the folder is
    never followed), from local safetensors files only; a ``Dense``'s weights
    from safetensors only; the post-processing of a ``FlowPooling`` is read
    with :func:`skflow.load`. Every setting of the folder is honoured as
    ``SentenceTransformer(path)`` honours it (``max_seq_length``,
    ``do_lower_case``, ``include_prompt``, the prompts, ``similarity_fn_name``,
    ``truncate_dim``, ...) or refused; see ``docs/serving.md``. ``kwargs``
    (``device``, ...) go to ``SentenceTransformer`` and win over the folder's settings.

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
        The folder is not one skflow writes (a missing or malformed
        ``modules.json`` or module configuration, a module path outside the
        folder, an encoder that would need code from the folder, a ``Dense``
        with an activation, post-processing that does not fit the encoder,
        ...); the message names the file.

    Examples
    --------
    >>> import tempfile
    >>> from skflow.serving import load_sentence_transformer
    >>> load_sentence_transformer(tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    skflow.persistence.InvalidModelError: .../modules.json: missing; not a folder written by ...
    """
    refused = sorted({"trust_remote_code", "modules", "model_name_or_path"} & set(kwargs))
    if refused:
        raise TypeError(f"load_sentence_transformer builds the modules itself and never runs code from the folder; "
                        f"it takes no {', '.join(refused)}")
    folder = check_folder(path)
    settings = dict(folder.model_settings)
    check_version_requirements(settings.pop("requirements", None), source=str(path))
    kwargs = {**settings, **kwargs}  # the caller's arguments first, as sentence-transformers has them
    config = folder.pooling_config
    if folder.dense is not None:
        transformer = _load_transformer(folder, hidden_states=False)
        modules = load_stock_modules(folder, transformer.get_embedding_dimension())
        return SentenceTransformer(modules=[transformer, *modules], **kwargs)
    if not (folder.pooling / FLOW_FILE).exists():
        raise persistence.InvalidModelError(f"{folder.pooling / FLOW_FILE}: missing; FlowPooling needs its flow")
    post = _load_post_processing(folder.pooling / FLOW_FILE)
    transformer = _load_transformer(folder, hidden_states=config["layers"] is not None)
    n_hidden = n_hidden_layers(transformer.auto_model.config)
    if config["layers"] is not None and max(config["layers"]) > n_hidden:
        raise persistence.InvalidModelError(
            f"{folder.pooling / 'config.json'}: layers {config['layers']} do not exist; the encoder has "
            f"hidden_states 0 to {n_hidden}"
        )
    if post.n_features_in_ != transformer.get_embedding_dimension():
        raise persistence.InvalidModelError(
            f"{folder.pooling / FLOW_FILE}: the {type(post).__name__} takes {post.n_features_in_} features, the "
            f"encoder gives {transformer.get_embedding_dimension()}"
        )
    return SentenceTransformer(modules=[transformer, FlowPooling(**config, flow=post)], **kwargs)


def _prompts(prompt: str | None) -> dict:
    """sentence-transformers' ``prompts`` and ``default_prompt_name`` for the embedder's ``prompt``.

    The embedder's prompt is the default one, and also its ``"query"`` and
    ``"document"`` prompts, so that ``encode``, ``encode_query`` and
    ``encode_document`` all give the pipeline's vectors.
    """
    if not prompt:
        return {}
    return {"prompts": {PROMPT_NAME: prompt, "query": prompt, "document": prompt}, "default_prompt_name": PROMPT_NAME}


def _pad_on_the_right(tokenizer) -> None:
    """The exported tokenizer pads on the right, with a pad token (its EOS if it has none), as skflow does.

    Poolings ignore padding on either side, but right padding keeps every real
    token at the position it has unpadded (decoders with absolute positions).
    """
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                "the tokenizer has neither a padding token nor an EOS token, so sentence-transformers cannot pad "
                "batches: give it one (tokenizer.pad_token = ...; tokenizer.save_pretrained(folder)) and refit"
            )
        tokenizer.pad_token = tokenizer.eos_token


def _load_post_processing(path) -> FlowGaussianizer | Whitener:
    post = persistence.load(path)
    if not isinstance(post, (FlowGaussianizer, Whitener)):
        raise persistence.InvalidModelError(
            f"{path}: holds a {type(post).__name__}, not a FlowGaussianizer or a Whitener"
        )
    if not hasattr(post, "flow_" if isinstance(post, FlowGaussianizer) else "components_"):
        raise persistence.InvalidModelError(f"{path}: holds an unfitted {type(post).__name__}")
    return post


def _load_transformer(exported: ExportedFolder, hidden_states: bool) -> Transformer:
    """The encoder and tokenizer of the folder, with its checked settings, loaded so that nothing in the folder can
    make transformers run code."""
    never = {"trust_remote_code": False, "local_files_only": True}
    folder = exported.transformer
    try:
        with quiet_transformers():
            return Transformer(
                str(folder),
                **exported.transformer_settings,  # max_seq_length, do_lower_case, ...: applied as for any folder
                model_kwargs={**never, "use_safetensors": True},  # no pickled .bin weights
                processor_kwargs=dict(never),
                config_kwargs={**never, **({"output_hidden_states": True} if hidden_states else {})},
                modality_config={"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
                module_output_name="token_embeddings",
            )
    except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        raise persistence.InvalidModelError(
            f"{folder}: the encoder cannot be loaded without code from the folder or files it lacks "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None


def _check_pipeline(pipeline) -> tuple[BertEmbedder, FlowGaussianizer | Whitener]:
    steps = getattr(pipeline, "steps", None)
    if not isinstance(pipeline, Pipeline) or len(steps) != 2:
        raise TypeError(
            "export_sentence_transformer takes a pipeline of two steps, BertEmbedder then FlowGaussianizer or "
            "Whitener, e.g. make_pipeline(BertEmbedder(), FlowGaussianizer()); got "
            f"{type(pipeline).__name__}"
        )
    embedder, post = steps[0][1], steps[1][1]
    if not isinstance(embedder, BertEmbedder) or not isinstance(post, (FlowGaussianizer, Whitener)):
        raise TypeError(
            "export_sentence_transformer takes a pipeline whose first step is a BertEmbedder and second a "
            f"FlowGaussianizer or a Whitener; got {type(embedder).__name__}, {type(post).__name__}"
        )
    check_is_fitted(post)
    embedder._validate_params()
    return embedder, post
