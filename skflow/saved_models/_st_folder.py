"""A sentence-transformers folder from elsewhere: a layout skflow writes, every setting honoured or refused."""

import json
import os
import stat
from numbers import Integral
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from skflow.embedding import STOCK_MODES, check_attention
from skflow.utils import InvalidModelError, UnreadableFileError, UntrustedTypeError, read_regular_file

# sentence-transformers' modules by every name it has given them (sentence_transformers.models.X: every release's)
MODULE_KINDS = {name: name.rsplit(".", 1)[1] for name in (
    "sentence_transformers.models.Transformer", "sentence_transformers.base.modules.transformer.Transformer",
    "sentence_transformers.models.Pooling", "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    "sentence_transformers.models.Normalize", "sentence_transformers.base.modules.normalize.Normalize",
    "sentence_transformers.models.Dense", "sentence_transformers.base.modules.dense.Dense",
    "skflow.serving.FlowPooling")}
LAYOUTS = (("Transformer", "FlowPooling"), ("Transformer", "Pooling", "Dense"),
           ("Transformer", "Pooling", "Normalize", "Dense"))
MODEL_SETTINGS = ("__version__", "prompts", "default_prompt_name", "truncate_dim", "requirements")
MODEL_FIXED = {"model_type": "SentenceTransformer",  # a tuple: the values allowed (SentenceTransformer's functions)
               "similarity_fn_name": ("cosine", "dot", "euclidean", "manhattan", None)}
# sentence-transformers reads the Transformer's settings from the first of these that holds any
TRANSFORMER_CONFIG_FILES = tuple(f"sentence_{name}_config.json" for name in (
    "bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet"))
# applied by sentence-transformers' Transformer.load, as for any folder
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
LEGACY_FLAGS = {"cls": "cls_token", "max": "max_tokens", "mean": "mean_tokens", "lasttoken": "lasttoken",
                "mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "weightedmean": "weightedmean_tokens"}
NORMALIZE_FIXED = {"module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}
DENSE_FIXED = {"activation_function": "torch.nn.modules.linear.Identity", **NORMALIZE_FIXED, "use_residual": False}
JSON_LIMIT = 2**20
_NOT_OURS = "not a folder written by skflow.export_sentence_transformer"
_LAYOUT_RULE = ("must list exactly two modules (Transformer, FlowPooling), or the stock modules Transformer, Pooling, "
                "optionally Normalize, then Dense")


def check_folder(path: str | os.PathLike) -> SimpleNamespace:
    """The module folders of an exported model, and their checked settings (as keyword arguments)."""
    root = Path(path).expanduser().resolve()  # not a folder: its modules.json is missing
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
    if "Normalize" in kinds:  # releases before 3 wrote no config.json
        where = folders["Normalize"] / "config.json"
        _check_settings(read_json(where) if where.exists() else {}, where, NORMALIZE_FIXED)
    read_json(folders[kinds[1]] / "config.json")  # present and bounded in size; its loader checks its keys
    checked = SimpleNamespace(transformer=folders["Transformer"], pooling=folders[kinds[1]],  # its loader checks it
                              settings=check_transformer_config(folders["Transformer"]), root=root,
                              model_settings=check_model_config(root), normalize="Normalize" in kinds,
                              dense=folders.get("Dense"))  # stock folders only
    check_numbers(checked, positions=None, width=None)
    return checked


def check_numbers(folder: SimpleNamespace, positions: int | None, width: int | None) -> None:
    """Each number an int the model supports: the lengths 1 to its ``positions``, ``truncate_dim`` 1 to its output
    ``width`` (``None``: any positive int, the check before the model loads)."""
    path, config = folder.settings
    numbers = [(path, key, config.get(key), positions) for key in ("max_seq_length", "query_length", "document_length")]
    numbers.append((folder.root / "config_sentence_transformers.json", "truncate_dim",
                    folder.model_settings.get("truncate_dim"), width))
    for where, key, value, most in numbers:
        if value is not None and not (isinstance(value, Integral) and not isinstance(value, bool)
                                      and 1 <= value <= (value if most is None else most)):
            bound = "a positive int" if most is None else f"an int from 1 to {most}, what the model supports"
            raise InvalidModelError(f"{where}: {key} must be {bound}; got {value!r}")


def check_transformer_config(folder: Path) -> tuple[Path, dict]:
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
    return path, config


def check_model_config(root: Path) -> dict:
    path = root / "config_sentence_transformers.json"
    config = read_json(path) if path.exists() else {}
    _check_settings(config, path, MODEL_FIXED, MODEL_SETTINGS)
    prompts, default = config.get("prompts") or {}, config.get("default_prompt_name")
    if not (isinstance(prompts, dict) and len(prompts) <= MAX_PROMPTS and default in (None, *prompts) and all(
            isinstance(k, str) and isinstance(v, str) and len(v) <= PROMPT_MAX_CHARS for k, v in prompts.items())):
        raise InvalidModelError(f"{path}: prompts must map at most {MAX_PROMPTS} names to strings of at most "
                                f"{PROMPT_MAX_CHARS} characters, default_prompt_name one of them or null")
    return {key: value for key, value in config.items()
            if value is not None and key not in ("__version__", "model_type")}


def _check_settings(config, path: Path, fixed: dict, free: tuple[str, ...] = ()) -> None:
    """A JSON object of settings skflow honours, ``fixed`` ones only at their value (or one of a tuple's)."""
    if not isinstance(config, dict):
        raise InvalidModelError(f"{path}: must be a JSON object")
    if unknown := sorted(set(config) - {*free, *fixed}):
        raise InvalidModelError(f"{path}: skflow does not load the settings {unknown} (it knows "
                                f"{', '.join((*free, *fixed))})")
    for key, value in fixed.items():
        allowed = value if isinstance(value, tuple) else (value,)
        if key in config and config[key] not in allowed:
            raise InvalidModelError(f"{path}: {key} must be {' or '.join(map(repr, allowed))}, got {config[key]!r}")


def read_json(path: Path):
    try:
        return json.loads(read_regular_file(path, JSON_LIMIT).decode("utf-8"))
    except FileNotFoundError:
        raise InvalidModelError(f"{path}: missing; {_NOT_OURS}") from None
    except (OSError, ValueError) as exc:  # an InvalidModelError (a ValueError) of the reader too
        reason = exc if isinstance(exc, UnreadableFileError) else f"not readable JSON ({type(exc).__name__}: {exc})"
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
            if not (stat.S_ISREG(status.st_mode) or stat.S_ISDIR(status.st_mode)) or status.st_dev in pseudo:
                raise InvalidModelError(f"{entry}: not a model file or folder (a FIFO, socket or device, or on /proc, "
                                        "/sys or /dev)")


def _module_dir(root: Path, relative: str) -> Path:
    try:
        folder = (root / relative).resolve(strict=True)
        if folder.is_dir() and folder.is_relative_to(root):
            return folder
    except (OSError, RuntimeError, ValueError):  # missing, a loop of links, a NUL byte
        pass
    raise InvalidModelError(f"{root / 'modules.json'}: module path {relative!r} must lead to a folder inside the model "
                            "folder (links resolved)")


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
    _write_json(transformer, {**config, "max_seq_length": int(max_seq_length), "do_lower_case": False})


def load_stock_modules(folder: SimpleNamespace) -> list[torch.nn.Module]:
    """A checked stock ``folder``'s modules, built here (nothing imported by name)."""
    from safetensors.torch import load
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling

    where = folder.dense / "config.json"
    config = read_json(where)
    _check_settings(config, where, DENSE_FIXED, ("in_features", "out_features", "bias"))
    n_in, n_out, bias = (config.get(key) for key in ("in_features", "out_features", "bias"))
    sizes = all(isinstance(n, Integral) and not isinstance(n, bool) and 0 < n <= 2**20 for n in (n_in, n_out))
    if not ("activation_function" in config and isinstance(bias, bool) and sizes and n_out <= n_in):
        raise InvalidModelError(f"{where}: Dense must be linear, bias a boolean, 0 < out_features <= in_features <= "
                                f"2**20, got bias={bias!r}, out_features={n_out!r}, in_features={n_in!r}")
    where = folder.pooling / "config.json"
    try:  # either format sentence-transformers has had; another key is the constructor's TypeError
        pooling = Pooling.load(str(folder.pooling), local_files_only=True)
    except (OSError, TypeError, ValueError) as exc:
        raise InvalidModelError(f"{where}: not a Pooling configuration ({exc})") from None
    if pooling.pooling_mode not in STOCK_MODES.values() or not isinstance(pooling.include_prompt, bool):
        raise InvalidModelError(f"{where}: Pooling's mode must be exactly one of {', '.join(STOCK_MODES.values())}, "
                                f"got {pooling.pooling_mode!r}; include_prompt a boolean: {pooling.include_prompt!r}")
    if pooling.embedding_dimension != n_in:
        raise InvalidModelError(f"{folder.dense / 'config.json'}: in_features is {n_in}, the pooling gives "
                                f"{pooling.embedding_dimension!r}")
    path = folder.dense / "model.safetensors"  # never a pickled pytorch_model.bin
    shapes = {"linear.weight": (n_out, n_in), **({"linear.bias": (n_out,)} if bias else {})}
    limit = 4 * sum(int(np.prod(shape)) for shape in shapes.values()) + 2**16  # float32, and the header
    try:
        tensors = load(read_regular_file(path, limit))
    except FileNotFoundError:
        raise InvalidModelError(f"{path}: missing; skflow reads a Dense's weights from safetensors only") from None
    except Exception as exc:  # noqa: BLE001 - too large, not a regular file, safetensors' own errors: one clear error
        raise InvalidModelError(f"{path}: not float32 weights of the configured shapes in safetensors "
                                f"({type(exc).__name__}: {exc})") from None
    found = {name: (tuple(t.shape), str(t.dtype)) for name, t in tensors.items()}
    expected = {name: (shape, "torch.float32") for name, shape in shapes.items()}
    if found != expected:
        raise InvalidModelError(f"{path}: must hold exactly {expected}, holds {found}")
    if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
        raise InvalidModelError(f"{path}: holds values that are not finite")
    linear = Dense(n_in, n_out, bias, activation_function=torch.nn.Identity(), init_weight=tensors["linear.weight"],
                   init_bias=tensors.get("linear.bias"))
    return [pooling, *([Normalize()] if folder.normalize else []), linear]


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
