"""A sentence-transformers folder from somebody else, checked before anything in it is read as a model.

skflow writes two layouts, so the loader does not let the folder choose
anything else: ``modules.json`` must list sentence-transformers'
``Transformer`` then skflow's ``FlowPooling``, or ``Transformer``,
``Pooling``, optionally ``Normalize``, then ``Dense`` (the stock-module
export of a whitened pipeline), each at a relative path that stays inside
the folder once links are resolved; every entry of the folder must be a file
or a folder (a FIFO would hang whoever reads it); each module's configuration
must be one skflow writes (a ``Dense`` must be linear: identity activation),
and a ``Dense``'s weights are read from safetensors only, their sizes checked
before reading. What is *not* checked here, on purpose, is whether some file
names code: the loader never lets transformers run any.
"""

import contextlib
import json
import os
import stat
from numbers import Integral
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import NamedTuple

import numpy as np
import torch

from skflow.embedding import POOLINGS, check_attention
from skflow.saved_models._skops import read_regular_file
from skflow.utils import InvalidModelError, UntrustedTypeError

TRANSFORMER_TYPES = ("sentence_transformers.base.modules.transformer.Transformer",
                     "sentence_transformers.models.Transformer")
POOLING_TYPE = "skflow.serving.FlowPooling"
# sentence-transformers' own modules, by the names it has given them: the short ones
# (sentence_transformers.models.X) are those every release and Text Embeddings Inference read.
STOCK_TYPES = {
    "sentence_transformers.models.Pooling": "Pooling",
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling": "Pooling",
    "sentence_transformers.models.Normalize": "Normalize",
    "sentence_transformers.base.modules.normalize.Normalize": "Normalize",
    "sentence_transformers.models.Dense": "Dense",
    "sentence_transformers.base.modules.dense.Dense": "Dense",
}
MODULE_KINDS = {**dict.fromkeys(TRANSFORMER_TYPES, "Transformer"), POOLING_TYPE: "FlowPooling", **STOCK_TYPES}
LAYOUTS = (("Transformer", "FlowPooling"), ("Transformer", "Pooling", "Dense"),
           ("Transformer", "Pooling", "Normalize", "Dense"))
IDENTITY = "torch.nn.modules.linear.Identity"
REDUCTIONS = tuple(sorted({reduction for reduction, _ in POOLINGS.values()}))
# skflow's token reduction -> sentence-transformers' Pooling mode that computes the same vector
STOCK_MODES = {"cls": "cls", "mean": "mean", "last_token": "lasttoken", "max": "max"}
MODEL_CONFIG_FILE = "config_sentence_transformers.json"
# The SentenceTransformer settings of MODEL_CONFIG_FILE: honoured as sentence-transformers honours them, or refused.
MODEL_SETTINGS = ("__version__", "model_type", "prompts", "default_prompt_name", "similarity_fn_name", "truncate_dim",
                  "requirements")
SIMILARITY_FN_NAMES = ("cosine", "dot", "euclidean", "manhattan")  # SentenceTransformer's
# sentence-transformers reads the Transformer's settings from the first of these that holds any
TRANSFORMER_CONFIG_FILES = ("sentence_bert_config.json", "sentence_roberta_config.json",
                            "sentence_distilbert_config.json", "sentence_camembert_config.json",
                            "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                            "sentence_xlnet_config.json")
# Transformer settings passed on to sentence-transformers' Transformer, which applies them as it does for any folder
TRANSFORMER_SETTINGS = ("max_seq_length", "do_lower_case", "query_length", "document_length", "unpad_inputs")
# Transformer settings that may only hold a plain text encoder's value: other tasks, modalities, processing or
# loading arguments chosen by the folder are refused
TEXT_ENCODER = {"transformer_task": "feature-extraction",
                "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
                "module_output_name": "token_embeddings", "processing_kwargs": {}, "query_expansion": None,
                **dict.fromkeys(("model_args", "model_kwargs", "tokenizer_args", "processor_kwargs", "config_args",
                                 "config_kwargs"), {})}
MAX_PROMPTS, PROMPT_MAX_CHARS = 64, 4096
POOLING_KEYS = ("reduction", "layers", "normalize")
MODULE_KEYS = {"idx": int, "name": str, "path": str, "type": str}
# pooling_mode_<key> booleans of the format before sentence-transformers 5.4 -> the mode's name now
LEGACY_POOLING_MODES = {"cls_token": "cls", "max_tokens": "max", "mean_tokens": "mean",
                        "mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "weightedmean_tokens": "weightedmean",
                        "lasttoken": "lasttoken"}
EMBEDDING = "sentence_embedding"
JSON_LIMIT = 2**20
_NOT_OURS = "not a folder written by skflow.export_sentence_transformer"
_LAYOUT_RULE = ("must list exactly two modules (Transformer, FlowPooling), or the stock modules Transformer, Pooling, "
                "optionally Normalize, then Dense")


class ExportedFolder(NamedTuple):
    root: Path  # links resolved
    transformer: Path
    pooling: Path
    pooling_config: dict  # FlowPooling: reduction, layers, normalize; stock: reduction, dimension, include_prompt,
    # normalize
    transformer_settings: dict  # Transformer keyword arguments (TRANSFORMER_SETTINGS), checked
    model_settings: dict  # SentenceTransformer keyword arguments (prompts, ...) and "requirements", checked
    dense: Path | None = None  # stock folders: the Dense module's folder
    dense_config: dict | None = None  # and its in_features, out_features, bias


def check_folder(path: str | os.PathLike) -> ExportedFolder:
    """The module folders of an exported model, and their configurations, checked."""
    given = Path(path).expanduser()
    if not given.is_dir():
        raise InvalidModelError(f"{given}: not a folder")
    try:
        root = given.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise InvalidModelError(f"{given}: cannot be resolved ({exc})") from None
    _check_entries(root)
    if (root / "adapter_config.json").exists():  # a PEFT adapter loads its base model from wherever it says
        raise InvalidModelError(f"{root}: holds adapter_config.json (a PEFT adapter); {_NOT_OURS}")
    where = root / "modules.json"
    modules = read_json(where)
    if not isinstance(modules, list) or not 2 <= len(modules) <= 4:
        raise InvalidModelError(f"{where}: {_LAYOUT_RULE}")
    for index, module in enumerate(modules):
        _check_module_entry(module, index, where)
        if module["type"] not in MODULE_KINDS:
            raise UntrustedTypeError(f"{where}: module {index} is {module['type']!r}, which skflow does not load; "
                                     f"{_LAYOUT_RULE}; {_NOT_OURS}")
    kinds = tuple(MODULE_KINDS[module["type"]] for module in modules)
    if kinds not in LAYOUTS:
        raise InvalidModelError(f"{where}: lists {', '.join(kinds)}; it {_LAYOUT_RULE}")
    folders = dict(zip(kinds, (_module_dir(root, module["path"]) for module in modules)))
    config_file = folders[kinds[1]] / "config.json"
    settings = check_transformer_config(folders["Transformer"]), check_model_config(root / MODEL_CONFIG_FILE)
    if kinds[1] == "FlowPooling":
        return ExportedFolder(root, folders["Transformer"], folders["FlowPooling"],
                              check_pooling_config(read_json(config_file), config_file), *settings)
    pooling = {**check_stock_pooling_config(read_json(config_file), config_file), "normalize": "Normalize" in kinds}
    if "Normalize" in kinds:
        _check_normalize(folders["Normalize"])
    dense_file = folders["Dense"] / "config.json"
    dense = check_dense_config(read_json(dense_file), dense_file)
    if dense["in_features"] != pooling["dimension"]:
        raise InvalidModelError(f"{dense_file}: in_features is {dense['in_features']}, the pooling gives "
                                f"{pooling['dimension']}")
    return ExportedFolder(root, folders["Transformer"], folders["Pooling"], pooling, *settings, folders["Dense"], dense)


def check_transformer_config(folder: Path) -> dict:
    """The Transformer's settings, read from the file sentence-transformers reads, as `Transformer` keyword arguments.

    Each setting is either passed on to sentence-transformers' ``Transformer``
    (`TRANSFORMER_SETTINGS`: it applies them exactly as when it loads the
    folder itself) or must hold a plain text encoder's value (`TEXT_ENCODER`);
    any other key is refused, so that no setting is silently ignored.
    """
    for name in TRANSFORMER_CONFIG_FILES:
        path = folder / name
        config = read_json(path) if path.exists() else {}
        if config:
            break
    if not isinstance(config, dict):
        raise InvalidModelError(f"{path}: must be a JSON object")
    unknown = sorted(set(config) - set(TRANSFORMER_SETTINGS) - set(TEXT_ENCODER))
    if unknown:
        raise InvalidModelError(f"{path}: skflow does not load the settings {unknown} (it honours "
                                f"{', '.join(TRANSFORMER_SETTINGS)}, and a text encoder's {', '.join(TEXT_ENCODER)})")
    for key, value in TEXT_ENCODER.items():
        if key in config and config[key] != value:
            raise InvalidModelError(f"{path}: {key} must be {value!r} (a text encoder's), got {config[key]!r}")
    encoder_file = folder / "config.json"  # transformers reads attn_implementation there: no hub kernel
    encoder = read_json(encoder_file)
    try:
        check_attention(encoder.get("attn_implementation") if isinstance(encoder, dict) else None,
                        f"{encoder_file}: attn_implementation")
    except ValueError as exc:
        raise InvalidModelError(str(exc)) from None
    settings = {key: config[key] for key in TRANSFORMER_SETTINGS if key in config}
    for key, value in settings.items():
        if key in ("max_seq_length", "query_length", "document_length"):
            if value is not None:
                _positive_int(value, key, path)
        elif not isinstance(value, bool) and not (key == "unpad_inputs" and value is None):
            raise InvalidModelError(f"{path}: {key} must be true or false, got {value!r}")
    return settings


def check_model_config(path: Path) -> dict:
    """The settings of ``config_sentence_transformers.json`` (absent: none), as `SentenceTransformer` arguments.

    Prompts, the default prompt, the similarity function and ``truncate_dim``
    are passed on as sentence-transformers takes them from the folder;
    ``requirements`` is returned for sentence-transformers' own check; a
    ``model_type`` other than ``SentenceTransformer`` and any other key are refused.
    """
    if not path.exists():
        return {}
    config = read_json(path)
    if not isinstance(config, dict):
        raise InvalidModelError(f"{path}: must be a JSON object")
    unknown = sorted(set(config) - set(MODEL_SETTINGS))
    if unknown:
        raise InvalidModelError(f"{path}: skflow does not load the settings {unknown} (it knows "
                                f"{', '.join(MODEL_SETTINGS)})")
    if config.get("model_type", "SentenceTransformer") != "SentenceTransformer":
        raise InvalidModelError(f"{path}: model_type must be 'SentenceTransformer', got {config['model_type']!r}")
    similarity, truncate_dim = config.get("similarity_fn_name"), config.get("truncate_dim")
    if similarity is not None and similarity not in SIMILARITY_FN_NAMES:
        raise InvalidModelError(f"{path}: similarity_fn_name must be one of {', '.join(SIMILARITY_FN_NAMES)}, got "
                                f"{similarity!r}")
    if truncate_dim is not None:
        _positive_int(truncate_dim, "truncate_dim", path)
    settings = {"similarity_fn_name": similarity, "truncate_dim": truncate_dim, "requirements": config.get(
        "requirements")}
    prompts, default = config.get("prompts"), config.get("default_prompt_name")
    prompts = {} if prompts is None else prompts
    if not (isinstance(prompts, dict) and len(prompts) <= MAX_PROMPTS and all(
        isinstance(k, str) and isinstance(v, str) and len(v) <= PROMPT_MAX_CHARS for k, v in prompts.items()
    )):
        raise InvalidModelError(f"{path}: prompts must map at most {MAX_PROMPTS} names to strings of at most "
                                f"{PROMPT_MAX_CHARS} characters")
    if default is not None and (not isinstance(default, str) or default not in prompts):
        raise InvalidModelError(f"{path}: default_prompt_name {default!r} is not one of the prompts {sorted(prompts)}")
    if prompts:
        settings.update(prompts=dict(prompts), default_prompt_name=default)
    return {key: value for key, value in settings.items() if value is not None}


def check_pooling_config(config, where) -> dict:
    """``FlowPooling``'s saved configuration, exactly as skflow writes it (else an `InvalidModelError`)."""
    if not isinstance(config, dict) or set(config) != set(POOLING_KEYS):
        found = sorted(config) if isinstance(config, dict) else type(config).__name__
        raise InvalidModelError(f"{where}: FlowPooling's configuration must have the keys {list(POOLING_KEYS)}, "
                                f"got {found}")
    if config["reduction"] not in REDUCTIONS:
        raise InvalidModelError(f"{where}: unknown reduction {config['reduction']!r}; FlowPooling knows {REDUCTIONS}")
    layers = config["layers"]
    if layers is not None and not (
        isinstance(layers, list) and layers
        and all(isinstance(v, Integral) and not isinstance(v, bool) and v >= 0 for v in layers)
    ):
        raise InvalidModelError(
            f"{where}: layers must be null or a non-empty list of hidden_states indices (ints >= 0), got {layers!r}"
        )
    if not isinstance(config["normalize"], bool):
        raise InvalidModelError(f"{where}: normalize must be true or false, got {config['normalize']!r}")
    return dict(config)


def check_stock_pooling_config(config, where) -> dict:
    """``Pooling``'s configuration: one of `STOCK_MODES` over a positive dimension, in either format it has had.

    The format of sentence-transformers before 5.4 (``word_embedding_dimension``
    and one boolean per mode), which skflow writes because Text Embeddings
    Inference reads only that, or the later one (``embedding_dimension``,
    ``pooling_mode``). Returns ``{"reduction", "dimension", "include_prompt"}``.
    """
    if not isinstance(config, dict):
        raise InvalidModelError(f"{where}: Pooling's configuration must be a JSON object")
    legacy = [f"pooling_mode_{key}" for key in LEGACY_POOLING_MODES]
    if "pooling_mode" in config:
        allowed, required, dimension_key = {"embedding_dimension", "pooling_mode", "include_prompt"}, set(), \
            "embedding_dimension"
        mode = config["pooling_mode"]
    else:
        allowed = {*legacy, "word_embedding_dimension", "include_prompt"}
        required, dimension_key = {"pooling_mode_cls_token", "pooling_mode_mean_tokens"}, "word_embedding_dimension"
        flags = {key: config.get(key, False) for key in legacy}
        if not all(isinstance(flag, bool) for flag in flags.values()):
            raise InvalidModelError(f"{where}: Pooling's pooling_mode_* entries must be true or false")
        chosen = [LEGACY_POOLING_MODES[key.removeprefix("pooling_mode_")] for key, flag in flags.items() if flag]
        mode = chosen[0] if len(chosen) == 1 else chosen
    unexpected, missing = set(config) - allowed, (required | {dimension_key}) - set(config)
    if unexpected or missing:
        raise InvalidModelError(f"{where}: Pooling's configuration has unexpected keys {sorted(unexpected)} or "
                                f"lacks {sorted(missing)}")
    if mode not in STOCK_MODES.values():
        raise InvalidModelError(f"{where}: Pooling's mode must be exactly one of {', '.join(STOCK_MODES.values())}, "
                                f"got {mode!r}")
    include_prompt = config.get("include_prompt", True)
    if not isinstance(include_prompt, bool):
        raise InvalidModelError(f"{where}: include_prompt must be true or false")
    return {"reduction": mode, "dimension": _positive_int(config[dimension_key], dimension_key, where),
            "include_prompt": include_prompt}


def check_dense_config(config, where) -> dict:
    """A linear ``Dense``'s configuration: identity activation, no residual. Returns in/out features and bias."""
    required = {"in_features", "out_features", "bias", "activation_function"}
    optional = {"module_input_name": EMBEDDING, "module_output_name": EMBEDDING, "use_residual": False}
    if not isinstance(config, dict) or not required <= set(config) <= required | set(optional):
        found = sorted(config) if isinstance(config, dict) else type(config).__name__
        raise InvalidModelError(f"{where}: Dense's configuration must have the keys {sorted(required)} (and "
                                f"optionally {sorted(optional)}), got {found}")
    if config["activation_function"] != IDENTITY:
        raise InvalidModelError(f"{where}: Dense's activation_function must be {IDENTITY} (skflow loads linear Dense "
                                f"modules only), got {config['activation_function']!r}")
    for key, value in optional.items():
        if key in config and config[key] != value:
            raise InvalidModelError(f"{where}: Dense's {key} must be {value!r}, got {config[key]!r}")
    if not isinstance(config["bias"], bool):
        raise InvalidModelError(f"{where}: Dense's bias must be true or false, got {config['bias']!r}")
    n_in, n_out = (_positive_int(config[key], key, where) for key in ("in_features", "out_features"))
    if n_out > n_in:  # a linear map of the pooled vector: skflow's keeps or drops directions, never adds
        raise InvalidModelError(f"{where}: out_features ({n_out}) must be at most in_features ({n_in})")
    return {"in_features": n_in, "out_features": n_out, "bias": config["bias"]}


def read_dense_weights(folder: Path, config: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A checked ``Dense``'s weight and bias, from ``model.safetensors`` only, sizes checked before reading."""
    from safetensors.torch import load

    path = folder / "model.safetensors"
    shapes = {"linear.weight": (config["out_features"], config["in_features"])}
    if config["bias"]:
        shapes["linear.bias"] = (config["out_features"],)
    limit = 4 * sum(int(np.prod(shape)) for shape in shapes.values()) + 2**16  # float32, and the header
    try:
        data = read_regular_file(path, limit)
    except FileNotFoundError:
        raise InvalidModelError(f"{path}: missing; skflow reads a Dense's weights from safetensors only") from None
    except InvalidModelError as exc:
        raise InvalidModelError(f"{path}: {exc} (float32 weights of the configured shapes)") from None
    try:
        tensors = load(data)
    except Exception as exc:  # noqa: BLE001 - safetensors' own error types: one clear error
        raise InvalidModelError(f"{path}: not a safetensors file ({type(exc).__name__}: {exc})") from None
    found = {name: (tuple(t.shape), str(t.dtype)) for name, t in tensors.items()}
    expected = {name: (shape, "torch.float32") for name, shape in shapes.items()}
    if found != expected:
        raise InvalidModelError(f"{path}: must hold exactly {expected}, holds {found}")
    if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
        raise InvalidModelError(f"{path}: holds values that are not finite")
    return tensors["linear.weight"], tensors.get("linear.bias")


def _check_normalize(folder: Path) -> None:
    config_file = folder / "config.json"
    config = read_json(config_file) if config_file.exists() else {}  # releases before 3 wrote none
    if not isinstance(config, dict) or any(
        key not in ("module_input_name", "module_output_name") or value != EMBEDDING for key, value in config.items()
    ):
        raise InvalidModelError(f"{config_file}: Normalize's configuration must be empty or name {EMBEDDING!r}, got "
                                f"{config!r}")


def _positive_int(value, key: str, where) -> int:
    if not isinstance(value, Integral) or isinstance(value, bool) or not 0 < value <= 2**20:
        raise InvalidModelError(f"{where}: {key} must be a positive int (at most 2**20), got {value!r}")
    return int(value)


def read_json(path: Path):
    """A small JSON file, refused if missing, not a regular file, too large or not JSON."""
    try:
        return json.loads(read_regular_file(path, JSON_LIMIT).decode("utf-8"))
    except FileNotFoundError:
        raise InvalidModelError(f"{path}: missing; {_NOT_OURS}") from None
    except (OSError, ValueError) as exc:  # an InvalidModelError (a ValueError) of the reader too
        reason = exc if isinstance(exc, InvalidModelError) else f"not readable JSON ({type(exc).__name__}: {exc})"
        raise InvalidModelError(f"{path}: {reason}") from None


def _pseudo_filesystems() -> set[int]:
    """The devices of /proc, /sys and /dev: their "regular" files can block a reader (/proc/kmsg) or never end."""
    found = set()
    for path in ("/proc", "/sys", "/dev"):
        with contextlib.suppress(OSError):
            found.add(os.stat(path).st_dev)
    return found


def _check_entries(root: Path) -> None:
    pseudo = _pseudo_filesystems()
    for folder, subfolders, files in os.walk(root):
        for name in subfolders + files:
            entry = Path(folder) / name
            try:
                status = os.stat(entry)
            except OSError as exc:
                raise InvalidModelError(f"{entry}: cannot be read ({exc.strerror}, a broken link?)") from None
            if not (stat.S_ISREG(status.st_mode) or stat.S_ISDIR(status.st_mode)):
                raise InvalidModelError(f"{entry}: neither a file nor a folder (a FIFO, socket or device)")
            if status.st_dev in pseudo:
                raise InvalidModelError(f"{entry}: leads into /proc, /sys or /dev, not to a model file")


def _check_module_entry(module, index: int, where: Path) -> None:
    if not isinstance(module, dict) or set(module) != set(MODULE_KEYS):
        raise InvalidModelError(f"{where}: module {index} must have exactly the keys {list(MODULE_KEYS)}")
    for key, kind in MODULE_KEYS.items():
        if not isinstance(module[key], kind) or isinstance(module[key], bool):
            raise InvalidModelError(
                f"{where}: module {index}'s {key} must be of type {kind.__name__}, got {module[key]!r}"
            )
    if module["idx"] != index:
        raise InvalidModelError(f"{where}: module {index} has idx {module['idx']}")


def _module_dir(root: Path, relative: str) -> Path:
    """``root / relative``, refused unless it is a folder inside ``root`` (links resolved)."""
    pure = PurePosixPath(relative)
    if pure.is_absolute() or PureWindowsPath(relative).is_absolute() or PureWindowsPath(relative).drive \
            or ".." in pure.parts or "\\" in relative or "\0" in relative:
        raise InvalidModelError(f"{root / 'modules.json'}: module path {relative!r} must be relative, without '..'")
    try:
        folder = (root / relative).resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links
        raise InvalidModelError(
            f"{root / 'modules.json'}: module path {relative!r} cannot be resolved ({exc})"
        ) from None
    if not folder.is_relative_to(root) or not folder.is_dir():
        raise InvalidModelError(f"{root / 'modules.json'}: module path {relative!r} leads outside the folder "
                                f"or to no folder ({folder})")
    return folder
