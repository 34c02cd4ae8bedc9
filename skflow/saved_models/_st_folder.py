"""sentence-transformers folders: written in stock modules, and, from somebody else, checked before use: a layout
skflow writes, every setting honoured or refused. Code a file names is not looked for: nothing from the folder is
ever run (``docs/serving.md``). sentence-transformers is imported only where modules are built."""

import json
import os
import stat
import warnings
from numbers import Integral
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from skflow.embedding import POOLINGS, check_attention
from skflow.saved_models._skops import read_regular_file
from skflow.utils import InvalidModelError, UntrustedTypeError

# sentence-transformers' modules by every name it has given them (sentence_transformers.models.X: every release's)
MODULE_KINDS = {name: name.rsplit(".", 1)[1] for name in (
    "sentence_transformers.models.Transformer", "sentence_transformers.base.modules.transformer.Transformer",
    "sentence_transformers.models.Pooling", "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    "sentence_transformers.models.Normalize", "sentence_transformers.base.modules.normalize.Normalize",
    "sentence_transformers.models.Dense", "sentence_transformers.base.modules.dense.Dense",
    "skflow.serving.FlowPooling")}
LAYOUTS = (("Transformer", "FlowPooling"), ("Transformer", "Pooling", "Dense"),
           ("Transformer", "Pooling", "Normalize", "Dense"))
IDENTITY = "torch.nn.modules.linear.Identity"
REDUCTIONS = tuple(sorted({reduction for reduction, _ in POOLINGS.values()}))
# skflow's token reduction -> sentence-transformers' Pooling mode that computes the same vector
STOCK_MODES = {"cls": "cls", "mean": "mean", "last_token": "lasttoken", "max": "max"}
MODEL_CONFIG_FILE = "config_sentence_transformers.json"
MODEL_SETTINGS = ("__version__", "prompts", "default_prompt_name", "similarity_fn_name", "truncate_dim", "requirements")
SIMILARITY_FN_NAMES = ("cosine", "dot", "euclidean", "manhattan")  # SentenceTransformer's
# sentence-transformers reads the Transformer's settings from the first of these that holds any
TRANSFORMER_CONFIG_FILES = tuple(f"sentence_{name}_config.json" for name in (
    "bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet"))
# passed on to sentence-transformers' Transformer, which applies them as it does for any folder
TRANSFORMER_SETTINGS = ("max_seq_length", "do_lower_case", "query_length", "document_length", "unpad_inputs")
# Transformer settings that may only hold a plain text encoder's value (no task, modality or loading argument)
TEXT_ENCODER = {"transformer_task": "feature-extraction",
                "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
                "module_output_name": "token_embeddings", "processing_kwargs": {}, "query_expansion": None,
                **dict.fromkeys(("model_args", "model_kwargs", "tokenizer_args", "processor_kwargs", "config_args",
                                 "config_kwargs"), {})}
MAX_PROMPTS, PROMPT_MAX_CHARS = 64, 4096
MODULE_KEYS = {"idx": int, "name": str, "path": str, "type": str}
# the Pooling mode -> its pooling_mode_<flag> boolean in the format before sentence-transformers 5.4
LEGACY_FLAGS = {"cls": "cls_token", "max": "max_tokens", "mean": "mean_tokens",
                "mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "weightedmean": "weightedmean_tokens",
                "lasttoken": "lasttoken"}
EMBEDDING = "sentence_embedding"
DENSE_FIXED = {"activation_function": IDENTITY, "module_input_name": EMBEDDING, "module_output_name": EMBEDDING,
               "use_residual": False}  # a linear map of the sentence embedding
JSON_LIMIT = 2**20
_NOT_OURS = "not a folder written by skflow.export_sentence_transformer"
_LAYOUT_RULE = ("must list exactly two modules (Transformer, FlowPooling), or the stock modules Transformer, Pooling, "
                "optionally Normalize, then Dense")


class ExportedFolder(NamedTuple):
    transformer: Path
    pooling: Path
    pooling_config: dict  # as read: FlowPooling's and sentence-transformers' Pooling's constructors check it
    transformer_settings: dict  # Transformer keyword arguments
    model_settings: dict  # SentenceTransformer keyword arguments and "requirements"
    dense: Path | None = None  # stock folders: the Dense module's folder, its checked configuration, and whether a
    dense_config: dict | None = None  # Normalize comes before it
    normalize: bool = False


def check_folder(path: str | os.PathLike) -> ExportedFolder:
    """The module folders of an exported model, and their configurations, checked."""
    given = Path(path).expanduser()
    if not given.is_dir():
        raise InvalidModelError(f"{given}: not a folder")
    root = given.resolve()
    _check_entries(root)
    if (root / "adapter_config.json").exists():  # a PEFT adapter loads its base model from wherever it says
        raise InvalidModelError(f"{root}: holds adapter_config.json (a PEFT adapter); {_NOT_OURS}")
    where = root / "modules.json"
    modules = read_json(where)
    if not isinstance(modules, list) or not 2 <= len(modules) <= 4:
        raise InvalidModelError(f"{where}: {_LAYOUT_RULE}")
    for index, module in enumerate(modules):
        if not (isinstance(module, dict) and set(module) == set(MODULE_KEYS) and module["idx"] == index
                and all(type(module[key]) is kind for key, kind in MODULE_KEYS.items())):
            raise InvalidModelError(f"{where}: module {index} must be {{'idx': {index}, 'name': str, 'path': str, "
                                    f"'type': str}}, got {module!r:.200}")
        if module["type"] not in MODULE_KINDS:
            raise UntrustedTypeError(f"{where}: module {index} is {module['type']!r}, which skflow does not load; "
                                     f"{_LAYOUT_RULE}; {_NOT_OURS}")
    kinds = tuple(MODULE_KINDS[module["type"]] for module in modules)
    if kinds not in LAYOUTS:
        raise InvalidModelError(f"{where}: lists {', '.join(kinds)}; it {_LAYOUT_RULE}")
    folders = dict(zip(kinds, (_module_dir(root, module["path"]) for module in modules)))
    settings = check_transformer_config(folders["Transformer"]), check_model_config(root / MODEL_CONFIG_FILE)
    if "Normalize" in kinds:
        _check_normalize(folders["Normalize"])
    dense = folders.get("Dense")
    dense_config = None if dense is None else check_dense_config(dense / "config.json")
    return ExportedFolder(folders["Transformer"], folders[kinds[1]], read_json(folders[kinds[1]] / "config.json"),
                          *settings, dense, dense_config, "Normalize" in kinds)


def check_transformer_config(folder: Path) -> dict:
    """The settings of the file sentence-transformers reads, as `Transformer` keyword arguments; others refused."""
    for name in TRANSFORMER_CONFIG_FILES:
        path = folder / name
        config = read_json(path) if path.exists() else {}
        if config:
            break
    _check_settings(config, path, TEXT_ENCODER, TRANSFORMER_SETTINGS)
    encoder_file = folder / "config.json"  # transformers reads attn_implementation there: no hub kernel
    encoder = read_json(encoder_file)
    try:
        check_attention(encoder.get("attn_implementation") if isinstance(encoder, dict) else None,
                        f"{encoder_file}: attn_implementation")
    except ValueError as exc:
        raise InvalidModelError(str(exc)) from None
    return {key: config[key] for key in TRANSFORMER_SETTINGS if key in config}


def check_model_config(path: Path) -> dict:
    """``config_sentence_transformers.json``'s settings (absent: none) as `SentenceTransformer` arguments, checked."""
    if not path.exists():
        return {}
    config = read_json(path)
    _check_settings(config, path, {"model_type": "SentenceTransformer"}, MODEL_SETTINGS)
    if config.get("similarity_fn_name") not in (*SIMILARITY_FN_NAMES, None):  # as SentenceTransformer refuses it
        raise InvalidModelError(f"{path}: similarity_fn_name must be one of {', '.join(SIMILARITY_FN_NAMES)}, got "
                                f"{config['similarity_fn_name']!r}")
    settings = {key: config.get(key) for key in ("similarity_fn_name", "truncate_dim", "requirements")}
    prompts, default = config.get("prompts") or {}, config.get("default_prompt_name")
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


def _check_settings(config, path: Path, fixed: dict, free: tuple[str, ...] = ()) -> None:
    """A JSON object of settings skflow honours, ``fixed`` ones only at their value: none is silently ignored."""
    if not isinstance(config, dict):
        raise InvalidModelError(f"{path}: must be a JSON object")
    unknown = sorted(set(config) - {*free, *fixed})
    if unknown:
        raise InvalidModelError(f"{path}: skflow does not load the settings {unknown} (it knows "
                                f"{', '.join((*free, *fixed))})")
    for key, value in fixed.items():
        if key in config and config[key] != value:
            raise InvalidModelError(f"{path}: {key} must be {value!r}, got {config[key]!r}")


def check_dense_config(where: Path) -> dict:
    """A linear ``Dense``'s configuration: identity activation (never imported), no residual."""
    config = read_json(where)
    _check_settings(config, where, DENSE_FIXED, ("in_features", "out_features", "bias"))
    required = ("in_features", "out_features", "bias", "activation_function")  # no activation_function: Tanh
    if not set(required) <= set(config):
        raise InvalidModelError(f"{where}: Dense's configuration must have the keys {', '.join(required)}")
    if not isinstance(config["bias"], bool):
        raise InvalidModelError(f"{where}: Dense's bias must be true or false, got {config['bias']!r}")
    n_in, n_out = config["in_features"], config["out_features"]
    if not all(isinstance(n, Integral) and not isinstance(n, bool) and 0 < n <= 2**20 for n in (n_in, n_out)):
        raise InvalidModelError(f"{where}: in_features and out_features must be positive ints (at most 2**20), got "
                                f"{n_in!r} and {n_out!r}")
    if n_out > n_in:  # a linear map of the pooled vector: skflow's keeps or drops directions, never adds
        raise InvalidModelError(f"{where}: out_features ({n_out}) must be at most in_features ({n_in})")
    return {"in_features": int(n_in), "out_features": int(n_out), "bias": config["bias"]}


def read_dense_weights(folder: Path, n_in: int, n_out: int, bias: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A checked ``Dense``'s weight and bias, from ``model.safetensors`` only, sizes checked before reading."""
    from safetensors.torch import load

    path = folder / "model.safetensors"
    shapes = {"linear.weight": (n_out, n_in), **({"linear.bias": (n_out,)} if bias else {})}
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
    path = folder / "config.json"
    config = read_json(path) if path.exists() else {}  # releases before 3 wrote none
    _check_settings(config, path, {"module_input_name": EMBEDDING, "module_output_name": EMBEDDING})


def read_json(path: Path):
    """A small JSON file, refused if missing, not a regular file, too large or not JSON."""
    try:
        return json.loads(read_regular_file(path, JSON_LIMIT).decode("utf-8"))
    except FileNotFoundError:
        raise InvalidModelError(f"{path}: missing; {_NOT_OURS}") from None
    except (OSError, ValueError) as exc:  # an InvalidModelError (a ValueError) of the reader too
        reason = exc if isinstance(exc, InvalidModelError) else f"not readable JSON ({type(exc).__name__}: {exc})"
        raise InvalidModelError(f"{path}: {reason}") from None


def _check_entries(root: Path) -> None:
    """Every entry a file or a folder, none on /proc, /sys or /dev (a FIFO or /proc/kmsg would block a reader)."""
    pseudo = {os.stat(path).st_dev for path in ("/proc", "/sys", "/dev") if os.path.exists(path)}
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


def _module_dir(root: Path, relative: str) -> Path:
    """``root / relative``, refused unless it is a folder inside ``root`` (links resolved)."""
    try:
        folder = (root / relative).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a loop of links, a NUL byte
        folder = None
    if folder is None or not folder.is_dir() or not folder.is_relative_to(root):
        raise InvalidModelError(f"{root / 'modules.json'}: module path {relative!r} must lead to a folder inside "
                                f"the model folder (links resolved)")
    return folder


def stock_modules(linear, dimension: int, reduction: str, normalize: bool) -> list[torch.nn.Module]:
    """``Pooling``, ``Normalize`` when the embedder normalizes (before the map, as skflow does), and the ``Dense``
    of a fitted linear post-processing's ``linear_map()`` (a `Whitener`, a `MeanDirectionRemover`)."""
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling

    matrix, bias = linear.linear_map()  # x @ matrix + bias: Dense's weight is matrix.T
    dense = Dense(*matrix.shape, bias=True, activation_function=torch.nn.Identity(),
                  init_weight=torch.from_numpy(matrix.T.astype(np.float32)),
                  init_bias=torch.from_numpy(bias.astype(np.float32)))
    return [Pooling(dimension, reduction), *([Normalize()] if normalize else []), dense]


def write_interoperable_configs(folder: Path, reduction: str, dimension: int, max_seq_length: int) -> None:
    """Rewrite what sentence-transformers saved in the format before 5.4, which every release and TEI read."""
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    for module in modules:
        module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[1]
    _write_json(folder / "modules.json", modules)
    pooling = next(folder / m["path"] for m in modules if m["type"].endswith(".Pooling"))
    modes = {f"pooling_mode_{flag}": mode == reduction for mode, flag in LEGACY_FLAGS.items()}
    _write_json(pooling / "config.json", {"word_embedding_dimension": dimension, **modes, "include_prompt": True})
    transformer = folder / "sentence_bert_config.json"
    config = json.loads(transformer.read_text(encoding="utf-8"))
    for key in ("max_seq_length", "do_lower_case"):
        config.pop(key, None)
    _write_json(transformer, {"max_seq_length": int(max_seq_length), "do_lower_case": False, **config})


def load_stock_modules(folder: ExportedFolder) -> list[torch.nn.Module]:
    """The ``Pooling`` (its configuration read by sentence-transformers, either format), ``Normalize`` and
    ``Dense`` of a checked ``folder``, built here (nothing imported by name)."""
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling

    where, dense = folder.pooling / "config.json", folder.dense_config
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the format before 5.4, which skflow writes
            pooling = Pooling(**folder.pooling_config)
    except (TypeError, ValueError) as exc:
        raise InvalidModelError(f"{where}: not a Pooling configuration ({exc})") from None
    if pooling.pooling_mode not in STOCK_MODES.values() or not isinstance(pooling.include_prompt, bool):
        raise InvalidModelError(f"{where}: Pooling's mode must be exactly one of {', '.join(STOCK_MODES.values())}, "
                                f"got {pooling.pooling_mode!r}, and include_prompt true or false, got "
                                f"{pooling.include_prompt!r}")
    if pooling.embedding_dimension != dense["in_features"]:
        raise InvalidModelError(f"{folder.dense / 'config.json'}: in_features is {dense['in_features']}, the pooling "
                                f"gives {pooling.embedding_dimension!r}")
    sizes = dense["in_features"], dense["out_features"], dense["bias"]
    weight, bias = read_dense_weights(folder.dense, *sizes)
    linear = Dense(*sizes, activation_function=torch.nn.Identity(), init_weight=weight, init_bias=bias)
    return [pooling, *([Normalize()] if folder.normalize else []), linear]


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
